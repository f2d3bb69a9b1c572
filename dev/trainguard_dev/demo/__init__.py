"""`trainguard demo`: a training run survives a silent death and ghost VRAM on a local cluster.

`main` runs the narrated scenario, `env` brings up its cluster, CRD, RBAC and operator,
`watch` follows the run's pods and state files for the narration.
"""
