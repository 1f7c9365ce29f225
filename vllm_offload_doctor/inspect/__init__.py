"""`offload-doctor inspect`: is `--cpu-offload-gb` in effect on a server that is already running?

The offloaded weights live in shared, pinned host memory, so each rank's `RssShmem` (in
/proc/PID/status) grows by what it offloads; a server whose runner ignored the flag stays at a
small baseline. Read-only: nothing is ever signalled.
"""
