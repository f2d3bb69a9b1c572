"""The pod contract: everything a training pod's containers are handed and exchange.

`env`: every environment variable the operator sets (or a node provides), with one typed
model, `PodEnv`, that the operator's pod builder writes and every program reads.
`files`: every file of the shared state directory, its name and its reader and writer;
`reports`: the init steps' reports and the summaries the status shows.
This is a ground package: it imports only `trainguard.api`.
"""
