"""The operator (`trainguard operator`): reconciles TrainingRuns into training pods.

Layers, top down (import-linter keeps them so): `main` (the process) and `handlers` (kopf
registrations) -> `k8s` (the only modules that talk to the apiserver) -> `policies` (pure
decisions) -> `build` (pure manifests) -> `conditions` (pure status) -> the ground packages.
"""
