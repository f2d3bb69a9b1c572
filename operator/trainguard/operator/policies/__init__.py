"""Pure policies: placement guard, escalation ladder, restart backoff, repeated-failure rule."""
