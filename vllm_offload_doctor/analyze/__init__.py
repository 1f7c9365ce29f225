"""analyze: reads vLLM server logs and names the root cause: engine (scan, feed, replay), verdict, facts, rules and the knowledge maps, renderers and the CLI."""
