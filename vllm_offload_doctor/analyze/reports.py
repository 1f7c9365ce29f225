"""Pasted reports inside a log: recognise them, never read them as log lines, keep their facts.

Bug reports hold more than the log: `vllm collect-env` output, `pip list` / `pip freeze`, an
`nvidia-smi` table, shell prompts, and offload-doctor's own `check`, `compare` and `analyze`
output (our remedies ask for it). Their lines quote errors and versions that are not events of
the run ('NVML Shared Library Not Found' in a check line is not this server's driver failure).

Recognition is per line (a shape, or a header seen earlier that the prefilter also sees), so the
prefiltered and unfiltered paths agree. Facts (vLLM and torch version, GPU, driver, CUDA) fill
only what the log itself lacks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from vllm_offload_doctor.analyze.model import Facts
from vllm_offload_doctor.analyze.normalize import Line
from vllm_offload_doctor.analyze.patterns import declare_words

# Words that reach the prefilter: each header or fact line below contains one of them.
KEYWORDS = (
    "Collecting environment information",
    "PyTorch version",
    "Is debug build",
    "vLLM Version",
    "vLLM Build Flags",
    "Versions of relevant libraries",
    "Nvidia driver version",
    "CUDA runtime version",
    "CUDA used to build PyTorch",
    "GPU models and configuration",
    "Driver Version:",
    "[pip3]",
    "[pip]",
    "[conda]",
    "vllm==",
    "torch==",
    "offload-doctor",
    "Doctor summary",
    "Doctor found",
    "[✓]",
    "[✗]",
    "[!]",
    "[-]",
    "Verdict: ",
    "  verdict:  ",
    "  evidence:",
    "most relevant lines:",
    "Artifacts: ",
    "GiB] ",
    "| ✅",
    "| ❌",
    "| ⚠",
    "| ➖",
    "vllm  ",
    "torch  ",
    "GPU 0: ",
)
declare_words(*KEYWORDS)

_V = r"(?P<v>\d+\.\d+(?:\.\d+)?(?:[\w.+-]*?))(?=[\s,;)@]|$)"

# (block kind, shape); a line of that shape belongs to that kind of pasted report.
_SHAPES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("offload-doctor check", re.compile(r"^\[[✓✗!\-?]\] [A-Za-z][\w ()./-]*(?: \d+)?: ")),
    ("offload-doctor check", re.compile(r"^ {2,}[→•] ")),
    (
        "offload-doctor check",
        re.compile(
            r"^(?:Doctor summary \(|[!✓] Doctor found |offload-doctor \S+ check:|#### offload-doctor )"
        ),
    ),
    ("offload-doctor check", re.compile(r"^\| (?:✅|❌|⚠️?|➖|❔) ?\w+ \| ")),
    ("offload-doctor compare", re.compile(r"^\[\d+/\d+ offload [\d.]+ GiB\] ")),
    (
        "offload-doctor compare",
        re.compile(
            r"^(?:Verdict: (?:OK|IGNORED|FAILED|INCONCLUSIVE)\b|Artifacts: /|  (?:Fix|See|Note): )"
        ),
    ),
    (
        "offload-doctor compare",
        re.compile(
            r"^(?:\| )?(?:status|vLLM version|model runner|startup|offloader|CPU offloaded \(log\)|Model loading took"
            r"|KV cache(?: tokens)?|GPU used \(device\)|GPU \(process tree\)|host RSS \(tree\)|latency \w+"
            r"|tokens/s|TTFT median|ITL median|requests ok|answers|\S+ (?:offloaded|loading))(?: {2,}| \| )\S"
        ),
    ),
    ("offload-doctor compare", re.compile(r"^ {8,}offload [\d.]+ GiB {2,}offload [\d.]+ GiB")),
    # report.md
    (
        "offload-doctor compare",
        re.compile(
            r"^(?:\*\*Verdict: `\w+`\*\* - |## (?:Side by side|Setup|Commands)$|\|  \| offload [\d.]+ GiB \|"
            r"|- offload [\d.]+ GiB \(log `|- (?:model|requests|environment|tensor parallel size)\b.*(?:`|stream=|per GPU))"
        ),
    ),
    (
        "offload-doctor compare",
        re.compile(
            r"^# (?:offload-doctor compare|environment passed|offload [\d.]+ GiB$)|^# {3}[A-Z][A-Z0-9_]*="
        ),
    ),
    (
        "offload-doctor analyze",
        re.compile(
            r"^  (?:verdict|offload|facts|remedy|link|also|note): +\S|^  (?:evidence|most relevant lines):$|^  next step: "
        ),
    ),
    (
        "offload-doctor analyze",
        re.compile(
            r"^counts: (?:[a-z_]+ \d+(?:, )?)+$|^file {2,}category {2,}offload {2,}summary$"
        ),
    ),
    (
        "offload-doctor analyze",
        re.compile(
            r"^### `[^`]+`: \*\*[a-z_]+\*\* — |^\*\*(?:Offload|What to do):\*\* |^<sub>vLLM \S+ · runner "
        ),
    ),
    (
        "vllm collect-env",
        re.compile(
            r"^(?:Collecting environment information|PyTorch version|Is debug build|CUDA used to build PyTorch"
            r"|ROCM used to build PyTorch|GCC version|Clang version|CMake version|Libc version|Python version"
            r"|Python platform|Is CUDA available|CUDA runtime version|CUDA_MODULE_LOADING set to"
            r"|GPU models and configuration|Nvidia driver version|cuDNN version|HIP runtime version"
            r"|MIOpen runtime version|Is XNNPACK available|vLLM Version|vLLM Build Flags|GPU Topology"
            r"|Neuron SDK Version|Versions of relevant libraries)\s*:?"
        ),
    ),
    ("vllm collect-env", re.compile(r"^\[(?:pip3?|conda)\] \S")),
    ("nvidia-smi", re.compile(r"^\|? ?NVIDIA-SMI \S+ +Driver Version: ")),
    ("pip list", re.compile(r"^(?:vllm|torch|transformers|triton|xformers|flashinfer[\w-]*)==\d")),
    ("pip list", re.compile(r"^(?:vllm|torch) {2,}\d[\w.+-]*\s*$")),
    (
        "shell prompt",
        re.compile(r"^(?:\([\w.-]+\) ?)?[\w.-]+@[\w.-]+(?::[^\s$#]*)? ?[$#] \S|^\$ \S"),
    ),
)
# Every shape is anchored at the start (tests/analyze/test_reports.py checks): one match of their
# alternation finds the first shape in order that matches, as trying them in turn does.
# (The leading ^ lets a search, too, try the start only.)
_ANY_SHAPE = re.compile("^(?:" + "|".join(f"({rx.pattern})" for _, rx in _SHAPES) + ")")


def _shape_groups() -> dict[int, str]:
    """The kind of each shape's group in _ANY_SHAPE (a shape's own groups follow its group)."""
    out, at = {}, 1
    for kind, rx in _SHAPES:
        out[at] = kind
        at += 1 + rx.groups
    return out


_SHAPE_KIND = _shape_groups()
# Lines of a collect-env block whose label alone is too common; only after its header.
_COLLECT_ENV_TAIL = re.compile(
    r"^(?:OS|Architecture|CPU op-mode\(s\)|Byte Order|Address sizes|CPU\(s\)|On-line CPU\(s\) list"
    r"|Vendor ID|Model name|CPU family|Model|Thread\(s\) per core|Core\(s\) per socket|Socket\(s\)"
    r"|Stepping|BogoMIPS|Flags|Virtualization|L[123][di]? cache|NUMA node\d*(?: CPU\(s\))?"
    r"|Vulnerability [\w ]+|CPU max MHz|CPU min MHz|Frequency boost|Hypervisor vendor|Virtualization type"
    r"|Legend|CPU Affinity|NUMA Affinity|Caching allocator config)\s*:"
    r"|^GPU ?\d+(?::| +(?:X|NV\d+|SYS|PIX|PXB|PHB|NODE)\b)|^ +(?:X|SYS|NODE|PHB|PXB|PIX|NV#) += "
    r"|^[A-Z][A-Z0-9_]{2,}=\S*$|^=+$|^ *(?:System|PyTorch|Python Environment|CUDA / GPU|CPU|vLLM"
    r"|Environment Variables) Info *$|^ *Versions of relevant libraries *$"
)
_COMPARE_COMMAND = re.compile(r"^\s*`?(?:vllm serve|python3? -m vllm\.entrypoints)\b")
_CHECK_ROW = r"^(?:\[[✓✗!]\] |\| \S+ ?\w+ \| )"

_FACTS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("vllm_version", re.compile(r"^vLLM Version\s*:\s*v?" + _V)),
    ("vllm_version", re.compile(r"^(?:\[pip3?\] |\[conda\] )?vllm(?:==| {2,})" + _V)),
    ("vllm_version", re.compile(_CHECK_ROW + r"vLLM:? (?:\| )?vLLM " + _V)),
    ("torch_version", re.compile(r"^PyTorch version\s*:\s*" + _V)),
    ("torch_version", re.compile(r"^(?:\[pip3?\] |\[conda\] )?torch(?:==| {2,})" + _V)),
    ("torch_version", re.compile(_CHECK_ROW + r"vLLM:? (?:\| )?vLLM \S+ \(torch " + _V)),
    ("driver_version", re.compile(r"^Nvidia driver version\s*:\s*(?P<v>\d[\d.]+)")),
    ("driver_version", re.compile(r"Driver Version: (?P<v>\d[\d.]+)")),
    (
        "driver_version",
        re.compile(_CHECK_ROW + r"NVIDIA driver \(NVML\):? (?:\| )?driver (?P<v>\d[\d.]+)"),
    ),
    ("cuda_version", re.compile(r"CUDA Version: (?P<v>\d[\d.]+)")),
    ("cuda_version", re.compile(r"^CUDA runtime version\s*:\s*(?P<v>\d[\d.]+)")),
    (
        "cuda_version",
        re.compile(
            _CHECK_ROW + r"NVIDIA driver \(NVML\):? (?:\| )?driver \S+, CUDA (?P<v>\d[\d.]+)"
        ),
    ),
    (
        "gpu_name",
        re.compile(
            r"^(?:\[[✓✗!]\] )?GPU \d+: (?P<v>(?:NVIDIA|Tesla|Quadro|AMD|Instinct|Radeon)[^,(]*?)(?:,| \(UUID|$)"
        ),
    ),
)


def is_doctor_output(line: str) -> bool:
    """Whether a line has the shape of offload-doctor's own check/compare/analyze output."""
    return any(kind.startswith("offload-doctor") and rx.search(line) for kind, rx in _SHAPES)


@dataclass(slots=True)
class Reports:
    """Pasted-report lines seen while a log streams past, and what they tell."""

    kinds: list[str] = field(default_factory=list)  # in order of first appearance
    facts: dict[str, str] = field(default_factory=dict)
    lines: int = 0  # lines read as pasted reports
    _collect_env: bool = False
    _after: int = -1  # the line right after a verdict header is its summary

    def feed(self, line: Line) -> str | None:
        """The kind of pasted report `line` belongs to, or None for a log line."""
        text = line.text
        kind = self._kind(line.no, text)
        if kind is None:
            return None
        self.lines += 1
        if not any(k in text for k in KEYWORDS):
            return kind  # skipped, but only lines the prefilter also reads may tell anything
        if kind not in self.kinds and kind != "shell prompt":
            self.kinds.append(kind)
        for fact, rx in _FACTS:
            if fact not in self.facts:
                m = rx.search(text)
                if m:
                    self.facts[fact] = m.group("v").strip()
        if kind == "vllm collect-env":
            self._collect_env = True
        if text.startswith(("Verdict: ", "  verdict:  ")):
            self._after = line.no + 1
        return kind

    def state(self, no: int) -> tuple[bool, bool, bool]:
        """What, besides its text, decides whether line `no` is read as a pasted report."""
        return (self._collect_env, self._after == no, "offload-doctor compare" in self.kinds)

    def _kind(self, no: int, text: str) -> str | None:
        if no == self._after and text.startswith("  "):
            return "offload-doctor " + (
                "compare" if "offload-doctor compare" in self.kinds else "analyze"
            )
        if not text:
            return None
        shape = _ANY_SHAPE.match(text)
        if shape is not None:
            return _SHAPE_KIND[shape.lastindex or 0]
        if "offload-doctor compare" in self.kinds and _COMPARE_COMMAND.match(text):
            return "offload-doctor compare"  # the commands compare ran, not this log's
        if self._collect_env and _COLLECT_ENV_TAIL.search(text):
            return "vllm collect-env"
        return None

    def fill(self, facts: Facts) -> None:
        """Give the log's facts what only the pasted reports tell."""
        if facts.vllm_version is None and "vllm_version" in self.facts:
            facts.vllm_version = self.facts["vllm_version"].split("@")[0].split("+")[0]
        if facts.gpu_name is None and "gpu_name" in self.facts:
            facts.gpu_name = self.facts["gpu_name"].strip()
        for key in ("torch_version", "driver_version", "cuda_version"):
            if getattr(facts, key) is None and key in self.facts:
                setattr(facts, key, self.facts[key])
        facts.pasted_reports = list(self.kinds)
