"""The pod agent (`trainguard agent`, a native sidecar): watches by absence, reports, ships.

`signals` probes the trainer (/proc, heartbeat, GPU readings, L1), `verdicts` classifies,
`main` renews the run's Lease with the verdict, `shipper` copies verified checkpoints to the
remote layers, and `kube` is the agent's own small API client (its Lease, its Events).
"""
