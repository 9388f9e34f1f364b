"""Publishing tasks by name. The API never imports task code: it sends task names and ARNs."""

from __future__ import annotations

import logging

import redis
from celery import Celery

log = logging.getLogger("eaglenest.queue")

TRAIN_QUEUE = "train"
SERVE_QUEUE = "serve"
OPTIMIZE_TASK = "eaglenest.optimize"
ENDPOINT_CREATE_TASK = "eaglenest.endpoint.create"
ENDPOINT_UPDATE_TASK = "eaglenest.endpoint.update"
ENDPOINT_DELETE_TASK = "eaglenest.endpoint.delete"
ENDPOINT_RECOVER_TASK = "eaglenest.endpoint.recover"
#: worker to worker, on a host's own queue: stop the endpoint's instances that host is to
#: stop (workers/serving/spread.py)
ENDPOINT_RETIRE_TASK = "eaglenest.endpoint.retire"


class TaskQueue:
    """Sends tasks to the broker; a failed publish is logged, never raised.

    State lives in the database, so a task that could not be published is not lost: every
    worker re-enqueues pending jobs and endpoints when it starts (workers.infra.reconcile).
    """

    def __init__(self, broker_url: str, timeout: float = 2.0) -> None:
        self.url, self.timeout = broker_url, timeout
        self.app = Celery("eaglenest-publisher", broker=broker_url, set_as_current=False)
        self.app.conf.update(
            broker_connection_timeout=timeout,
            broker_connection_retry_on_startup=False,
            broker_transport_options={
                "socket_timeout": timeout,
                "socket_connect_timeout": timeout,
            },
        )

    def send(self, task: str, arn: str, queue: str, countdown: float = 0) -> bool:
        """Publish `task` for the resource `arn` (its one argument: the ARN names the
        account, so a worker never mistakes another account's resource of the same name),
        to run no sooner than `countdown` seconds from now."""
        try:
            self.app.send_task(
                task, args=[arn], queue=queue, retry=True, countdown=countdown or None,
                retry_policy={"max_retries": 2, "interval_start": 0.1, "interval_step": 0.2},
            )
        except Exception as exc:  # broker down: the reconciler picks it up later
            log.warning("could not publish %s(%s) to %s: %s", task, arn, queue, exc)
            return False
        return True

    def waiting(self, queue: str) -> int | None:
        """Messages waiting in `queue` (Redis broker), None if that cannot be read."""
        try:
            with self.app.connection_for_read() as conn:
                client = conn.default_channel.client
                return int(client.llen(queue))
        except Exception:
            return None

    def broker_up(self) -> bool:
        """Whether the broker (Redis) answers a PING within the publish timeout."""
        try:
            client = redis.Redis.from_url(self.url, socket_timeout=self.timeout,
                                          socket_connect_timeout=self.timeout)
            try:
                return bool(client.ping())
            finally:
                client.close()
        except Exception:  # down, refusing, or not Redis
            return False

    def close(self) -> None:
        self.app.close()
