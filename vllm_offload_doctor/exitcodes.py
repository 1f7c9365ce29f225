"""Exit statuses shared by every command."""

from __future__ import annotations

OK = 0  # nothing wrong found / offload took effect
FOUND = 1  # a failure diagnosed / a check failed / offload ignored
USAGE = 2  # usage, input or environment error: could not reach a verdict
INTERNAL = 3  # a bug of ours
INTERRUPTED = 130  # Ctrl+C, 128 + SIGINT
TERMINATED = 143  # SIGTERM (compare stops its servers first), 128 + SIGTERM
HANGUP = 129  # SIGHUP: a closed terminal or a dropped ssh session; handled like SIGTERM
QUIT = 131  # SIGQUIT; handled like SIGTERM
