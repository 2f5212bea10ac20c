"""``--log-to mlflow[:TRACKING_URI]``: one MLflow run per session in the experiment ``advisor``,
through ``mlflow-skinny``'s client. Where: the given URI, else ``MLFLOW_TRACKING_URI``, else
MLflow's own default (``sqlite:///mlflow.db`` in the current folder): a local store needs no
server and no network."""

from __future__ import annotations

import time

from advisor.trackers.series import APPLY_COLUMNS, RECOMMENDATION_COLUMNS, TrackerData

PACKAGE = "mlflow"
EXPERIMENT = "advisor"
BATCH = 1000  # MLflow's log_batch limit on metrics per call


def log(data: TrackerData, where: str | None) -> str:
    """Log the session as an MLflow run; where it went (the tracking URI and the run id)."""
    from mlflow import MlflowClient  # the extra advisor[mlflow]; loaded only when asked for
    from mlflow.entities import Metric, Param, RunTag

    client = MlflowClient(tracking_uri=where) if where else MlflowClient()
    experiment = client.get_experiment_by_name(EXPERIMENT)
    experiment_id = experiment.experiment_id if experiment is not None else client.create_experiment(EXPERIMENT)
    run = client.create_run(experiment_id, run_name=data.session_id, tags={"advisor.session": data.session_id})
    run_id = run.info.run_id
    now = int(time.time() * 1000)
    try:
        metrics = [Metric(name, value, now, step) for step in sorted(data.metrics)
                   for name, value in data.metrics[step].items()]
        metrics += [Metric(name, value, now, 0) for name, value in data.summary.items() if not isinstance(value, str)]
        params = [Param(name, value) for name, value in data.summary.items() if isinstance(value, str)]
        for start in range(0, len(metrics), BATCH):
            client.log_batch(run_id, metrics=metrics[start:start + BATCH],
                             params=params if start == 0 else (), tags=[RunTag("advisor.findings", "findings.md")])
        if not metrics:
            client.log_batch(run_id, params=params)
        client.log_text(run_id, data.findings, "advisor/findings.md")
        client.log_dict(run_id, {"columns": RECOMMENDATION_COLUMNS, "rows": data.recommendations},
                        "advisor/recommendations.json")
        client.log_dict(run_id, {"columns": APPLY_COLUMNS, "rows": data.applies}, "advisor/applied.json")
    except BaseException:
        client.set_terminated(run_id, status="FAILED")
        raise
    client.set_terminated(run_id)
    return f"{client.tracking_uri} run {run_id}"

