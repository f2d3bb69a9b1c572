"""The trainer harness: verified asynchronous checkpoints, heartbeat, supervisor, reference trainer."""
