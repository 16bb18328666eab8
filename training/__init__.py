"""Training pipelines: Stage and Iconq+ from query logs, MLflow registration, Optuna studies."""
