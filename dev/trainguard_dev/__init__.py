"""trainguard's development tools: the local control plane, the demo and the test helpers.

A distribution of its own (`dev/pyproject.toml`), installed from the checkout by
`hack/setup.sh`; the product (`trainguard`) never imports it and its images never contain it.
It plugs `trainguard dev` and `trainguard demo` into the product's command line through the
`trainguard.commands` entry points.
"""
