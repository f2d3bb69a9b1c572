"""The `trainguard` command line.

`main` dispatches each subcommand to its program's module; `status` is `trainguard status`,
a TrainingRun's timeline from its status and Events.
"""
