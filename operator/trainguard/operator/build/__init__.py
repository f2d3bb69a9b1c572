"""Pure builders: typed spec and observed state -> complete manifest dicts, one module per kind."""
