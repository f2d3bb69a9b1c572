"""The operator's API wall: the only modules that talk to the Kubernetes API.

`client` alone imports the Kubernetes client; `apply`, `reconcile`, `pods`, `leases`, `nodes`,
`events` and `volumes` speak plain manifests through it.
"""
