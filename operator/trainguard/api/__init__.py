"""The TrainingRun API (trainguard.dev/v1alpha1): pydantic models, the CRD's single source."""
