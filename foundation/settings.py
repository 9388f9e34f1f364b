"""The one settings class. Built explicitly and passed in; nothing reads env at import time."""

from __future__ import annotations

import configparser
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

CREDENTIALS_PROFILE = "eaglenest"
#: the credentials-file option naming the 12-digit account a profile's key acts for
ACCOUNT_OPTION = "eaglenest_account_id"


def _quota(value: object) -> object:
    """A per-account quota's setting: a count, or ``unlimited`` (None: no limit)."""
    return None if isinstance(value, str) and value.strip().lower() == "unlimited" else value


#: a per-account quota (db/quotas.py): a count >= 0, or ``unlimited`` (None), which only an
#: operator's setting gives
Quota = Annotated[Annotated[int, Field(ge=0)] | None, BeforeValidator(_quota)]


@dataclass(frozen=True)
class AccessKey:
    """An access key pair, the account it acts for and its name (`eaglenest keys`)."""

    access_key_id: str
    secret: str
    account_id: str
    name: str


def default_data_dir() -> Path:
    """The per-user data dir: `$XDG_DATA_HOME/eaglenest`, else `~/.local/share/eaglenest`.

    Never relative to the current directory (a relative XDG_DATA_HOME is ignored, as the XDG
    base-directory spec says), so every command finds the same EagleNest wherever it runs.
    """
    xdg = os.environ.get("XDG_DATA_HOME", "")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".local" / "share"
    return base / "eaglenest"


class Settings(BaseSettings):
    """All configuration, from `EAGLENEST_*` environment variables.

    The data dir is `--data-dir` where a command has it (the command overrides the field),
    else EAGLENEST_DATA_DIR, else default_data_dir().
    """

    model_config = SettingsConfigDict(env_prefix="EAGLENEST_", extra="ignore")

    data_dir: Path = Field(default_factory=default_data_dir)
    database_url: str | None = None
    broker_url: str | None = None
    region: str = "us-east-1"
    account_id: str = Field(default="000000000000", pattern=r"^\d{12}$")
    access_key_id: str | None = None
    secret_access_key: str | None = None
    s3_endpoint_url: str | None = None
    #: seconds of clock skew accepted in SigV4 X-Amz-Date (AWS allows 15 minutes)
    signature_max_skew: int = 900
    #: the largest control-plane request body accepted (bytes; more: 413 before it is read).
    #: The largest valid SageMaker request is about 3.2 MB (docs/security.md).
    max_request_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    #: seconds sagemaker-runtime waits for a model server's next bytes (SageMaker: 60 s)
    invocation_timeout_seconds: float = Field(default=60.0, gt=0)
    # -- connection limits of the API, both planes, before any request is authenticated
    # (foundation/http/connections.py; docs/security.md, "Connections") --
    #: the largest request line plus headers (bytes; more: 431 before the rest is read).
    #: The largest boto3 request's, every runtime header at its maximum and a 4 KiB session
    #: token, is about 8.6 KB; Node.js and h11 stop at 16 KiB too
    max_header_bytes: int = Field(default=16 * 1024, ge=4096)
    #: seconds a connection has to send its request line and headers, counted from its
    #: opening (from the first byte of a kept-alive connection's next request); more: 408
    header_timeout_seconds: float = Field(default=20.0, gt=0)
    #: seconds a request body may go without a byte; more: 408 and the connection closed
    body_timeout_seconds: float = Field(default=20.0, gt=0)
    #: seconds a response may go without the client taking a byte of it while it waits
    #: on the client (our buffer full, or the rest of it in our buffer); more: reset
    send_timeout_seconds: float = Field(default=20.0, gt=0)
    #: bytes per second a request body, and a response the client holds up, must average
    #: after their first body / send timeout seconds (a byte every 8 s is under it); 0: no
    #: rate rule, only the timeouts
    min_transfer_rate: float = Field(default=500.0, ge=0)
    #: connections open at once (at most half the open-file limit); past it the longest
    #: idle one is closed to make room, or, all busy, the new one gets a 503
    max_connections: int = Field(default=1024, ge=1)
    #: the same, per client address
    max_connections_per_address: int = Field(default=256, ge=1)
    #: seconds a broker publish may take before the API gives up (the row stays; the
    #: worker's start-up reconciliation re-enqueues it)
    broker_publish_timeout: float = 2.0
    #: queues the worker of `eaglenest up` consumes; empty: `up` starts no worker (for a
    #: setup whose workers run elsewhere)
    worker_queues: str = "train,serve"
    #: the address other hosts reach this worker's serving processes at; anything but
    #: 127.0.0.1 makes them listen on all interfaces (docker compose, several hosts)
    advertise_host: str = "127.0.0.1"
    #: a job whose worker has not heartbeaten for this long is presumed dead and resumed
    #: elsewhere; workers heartbeat every third of it and re-check every lease
    job_lease_seconds: float = Field(default=60.0, ge=3.0)
    #: no endpoint stays Creating, Updating, Deleting or SystemUpdating longer than this: the
    #: worker watchdog marks it Failed (an update rolls back) with a FailureReason saying
    #: so. Keep it above the largest ContainerStartupHealthCheckTimeoutInSeconds plus the
    #: time to fetch a model.
    endpoint_transition_seconds: float = Field(default=7200.0, gt=0)
    #: Data Capture files are rolled at this age (or at 4 MiB)
    capture_flush_seconds: float = Field(default=60.0, gt=0)
    #: sagemaker-runtime keeps an endpoint's routes (its instances' addresses) this long
    #: instead of reading the database on every invocation; 0 reads it every time. An
    #: instance that refuses the connection makes the route be read again at once.
    route_cache_seconds: float = Field(default=1.0, ge=0)
    #: the most serving processes (InitialInstanceCount) one production variant may ask for;
    #: CreateEndpointConfig refuses more (each is a full model server on this host)
    max_instances_per_variant: int = Field(default=4, ge=1)
    #: per-account quotas (ResourceLimitExceeded beyond them; each a count or ``unlimited``;
    #: db/quotas.py, docs/security.md "Quotas"): endpoints, model server processes across
    #: all of an account's endpoints, optimization jobs not yet ended
    max_endpoints: Quota = 10
    max_instances: Quota = 16
    max_concurrent_optimization_jobs: Quota = 4
    #: GPUs held across all of an account's endpoints and jobs not yet ended (each instance
    #: holds its type's GPUs): one 8-GPU instance type's worth, not a whole fleet
    max_gpus: Quota = 8
    #: models, endpoint configurations and optimization jobs (any status) an account keeps
    max_models: Quota = 100
    max_endpoint_configs: Quota = 100
    max_optimization_jobs: Quota = 100
    # -- resources a request multiplies (foundation/host/ceilings.py; docs/security.md, "Ceilings
    # and disk quotas") --
    #: a worker's host runs at most this many compute processes (model servers, training
    #: ranks); one that would start more fails the transition or job. 0: four per usable
    #: CPU, at least 16
    max_compute_processes: int = Field(default=0, ge=0)
    #: per account, the bytes of Data Capture records spooled on an API host and not yet
    #: in the store; past it records are not captured until uploads free room
    max_capture_spool_bytes: int = Field(default=256 * 1024 * 1024, ge=0)
    #: per account, the bytes in the artifact store's buckets it owns (job outputs, Data
    #: Capture, what was uploaded for it); a job's outputs or a capture past it are refused
    max_stored_bytes: int = Field(default=1024**4, ge=0)
    #: per account, the buckets it may own through the S3 API's CreateBucket (S3's default
    #: quota); 0: no limit
    max_buckets: int = Field(default=100, ge=0)
    #: seconds a multipart upload may stay idle (no part received) before it is aborted and
    #: its parts removed, like S3's lifecycle rule AbortIncompleteMultipartUpload
    multipart_max_age: float = Field(default=86400.0, gt=0)
    #: log lines of every process (`eaglenest up/api/worker`): plain text, or one JSON
    #: object per line (ts, level, logger, message, job/endpoint, exc) for log shippers
    log_format: Literal["text", "json"] = "text"
    #: a train worker's default for jobs that do not set EAGLENEST_TRAIN_PROCESSES: >1 trains
    #: each job's head data-parallel in that many processes (torchrun DDP, one per GPU)
    train_processes: int = Field(default=1, ge=1, le=64)
    #: the worker's GPUs (foundation/host/gpus.py): empty = every GPU it sees, ``none``, indexes
    #: such as ``0,1``, or a declared inventory such as ``4x24GiB``
    gpus: str = ""
    #: this host's name in the GPU inventory and its placement queues (``serve.<host>``);
    #: workers on one machine that share its GPUs use one name
    host_name: str = Field(default_factory=socket.gethostname, pattern=r"^[A-Za-z0-9_.-]{1,128}$")
    #: how long an endpoint transition or a job waits for free GPUs before it fails with
    #: SageMaker's insufficient-capacity reason (an update rolls back)
    capacity_wait_seconds: float = Field(default=600.0, ge=0)
    #: the module a vLLM server runs as (`python -m <module>`): vLLM's OpenAI server; an
    #: operator's setting, never a caller's
    vllm_module: str = "vllm.entrypoints.openai.api_server"
    # -- metrics: the per-account, per-minute store (db/metrics_repo.py) and the console --
    #: days a minute of metric data is kept (CloudWatch keeps 1-minute data 15 days); older
    #: minutes are swept by each MetricBuffer's flusher about once an hour
    metrics_retention_days: int = Field(default=15, ge=1, le=455)
    #: metric series (namespace, name, dimensions) one account may have; a datum of a new
    #: series beyond it is dropped and counted (MetricBuffer.dropped)
    metrics_max_series_per_account: int = Field(default=2000, ge=1)
    #: seconds between a MetricBuffer's writes of what it aggregated to the database
    metrics_flush_seconds: float = Field(default=1.0, gt=0, le=60)
    #: seconds between two samples of a worker's model servers and of its host (workers/
    #: serving/endpoint_metrics.py, workers/infra/host_metrics.py)
    metrics_sample_seconds: float = Field(default=60.0, gt=0, le=3600)
    #: the bearer token the API's `/metrics` asks for (`Authorization: Bearer <token>`; it
    #: shows every account's series). Unset: `/metrics` answers loopback clients only (the
    #: single-host `eaglenest up`). At least 16 characters of A-Z a-z 0-9 - . _ ~ + / =
    #: (`openssl rand -hex 32`), checked when the API starts (api/observability.py
    #: `checked_token`, whose error, unlike a field constraint's, does not echo the secret)
    metrics_token: str | None = None
    #: seconds a console sign-in lasts (api/console/) before the session cookie expires
    console_session_seconds: int = Field(default=28800, ge=60)
    #: console sign-in attempts per minute, per client address and per access key id; more
    #: are refused until the minute is over
    console_login_attempts_per_minute: int = Field(default=5, ge=1)

    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'eaglenest.db').resolve()}"

    @property
    def credentials_file(self) -> Path:
        return self.data_dir / "credentials"

    @property
    def artifact_dir(self) -> Path:
        return self.data_dir / "s3"

    @property
    def kernels_dir(self) -> Path:
        """The host's linear-kernel timing cache (models/decode/kernel_cache.py), shared by
        the embedded servers of this data dir's workers and `eaglenest bench`."""
        return self.data_dir / "kernels"

    def credentials(self) -> dict[str, str]:
        """Access key -> secret (every key of `keys()`)."""
        return {k: v.secret for k, v in self.keys().items()}

    def keys(self) -> dict[str, AccessKey]:
        """Access key -> AccessKey: the profiles of `<data-dir>/credentials` (each acts for
        its `eaglenest_account_id`, else `account_id`) and, when set, the key pair of
        EAGLENEST_ACCESS_KEY_ID / EAGLENEST_SECRET_ACCESS_KEY (for `account_id`)."""
        keys = read_keys(self.credentials_file, self.account_id)
        if self.access_key_id and self.secret_access_key:
            keys[self.access_key_id] = AccessKey(self.access_key_id, self.secret_access_key,
                                                 self.account_id, "environment")
        return keys


class CredentialsError(ValueError):
    """A credentials file EagleNest refuses to load: unreadable as INI, or one access key id
    under several profiles (which account would it act for?). The message names the file
    and, for a duplicate, the key id and every profile holding it. `usable`: the file's
    other keys (the API keeps serving those; the CLI stops)."""

    def __init__(self, message: str, usable: dict[str, AccessKey] | None = None) -> None:
        super().__init__(message)
        self.usable = usable or {}


def read_keys(path: Path, default_account: str) -> dict[str, AccessKey]:
    """The key pairs of an AWS shared-credentials file, one per profile; a profile without
    a valid `eaglenest_account_id` acts for `default_account`. CredentialsError when the
    file is not INI or an access key id is under two profiles (no profile silently wins)."""
    if not path.exists():
        return {}
    parser = configparser.ConfigParser()
    try:
        parser.read(path)
    except configparser.Error as exc:
        raise CredentialsError(f"{path}: {exc}") from None
    found: dict[str, list[AccessKey]] = {}
    for section in parser.sections():
        key = parser.get(section, "aws_access_key_id", fallback=None)
        secret = parser.get(section, "aws_secret_access_key", fallback=None)
        account = parser.get(section, ACCOUNT_OPTION, fallback="")
        if not (len(account) == 12 and account.isdigit()):
            account = default_account
        if key and secret:
            found.setdefault(key, []).append(AccessKey(key, secret, account, section))
    keys = {key: same[0] for key, same in found.items() if len(same) == 1}
    for key, same in found.items():
        if len(same) > 1:
            names = ", ".join(repr(k.name) for k in same)
            raise CredentialsError(
                f"{path}: access key id {key} is under {len(same)} profiles ({names}); a "
                "key acts for one account: remove it from all but one", usable=keys)
    return keys
