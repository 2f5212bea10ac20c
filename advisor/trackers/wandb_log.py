"""``--log-to wandb[:PROJECT]``: one Weights & Biases run per session (project ``advisor`` by
default). The user's own settings decide where it goes: ``WANDB_MODE=offline`` writes under
``./wandb`` for a later ``wandb sync``. The run never captures the controller's console."""

from __future__ import annotations

from advisor.trackers.series import APPLY_COLUMNS, RECOMMENDATION_COLUMNS, TrackerData

PACKAGE = "wandb"
PROJECT = "advisor"


def log(data: TrackerData, where: str | None) -> str:
    """Log the session as a W&B run; where it went (the run's folder or URL)."""
    import wandb  # the extra advisor[wandb]; loaded only when asked for

    run = wandb.init(project=where or PROJECT, name=data.session_id, job_type="advisor", reinit="create_new",
                     config={"advisor.session": data.session_id},
                     settings=wandb.Settings(silent=True, console="off"))
    try:
        # W&B wants steps in order, each logged once: every series of a step in one call.
        for step in sorted(data.metrics):
            run.log(data.metrics[step], step=step)
        run.summary.update(dict(data.summary))
        last = max(data.metrics, default=0)
        run.log({"advisor/findings": wandb.Html(f"<pre>{_escape(data.findings)}</pre>"),
                 "advisor/recommendations": wandb.Table(columns=RECOMMENDATION_COLUMNS, data=data.recommendations),
                 "advisor/applied": wandb.Table(columns=APPLY_COLUMNS, data=data.applies)}, step=last)
        where_to = getattr(run, "url", None) or run.dir
    except BaseException:
        run.finish(exit_code=1)
        raise
    run.finish()
    return str(where_to)


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
