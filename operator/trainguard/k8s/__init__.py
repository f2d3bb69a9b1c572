"""The only modules that talk to the Kubernetes API (apply, read, events, leases)."""
