"""The pod agent: probes, verdicts, lease renewal, checkpoint shipping, restore, staging."""
