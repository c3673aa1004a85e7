"""Independent units of work (one checkpoint's training, one checkpoint x cohort audit) as tasks.

``TaskRunner(scheduler)`` maps a function over units; ``task_map_for(runner)`` is the
``task_map`` argument of the core loops (``training.train_matrix``, ``audit.audit_registry``,
``transfer.audit_cohorts``; ``None``: the plain loop). Schedulers (``parse_scheduler``; profile
key ``shared.scheduler``, ``run_all.sh --scheduler``):

- ``""`` or ``"sequential"`` (default): in this process, one unit after the other; no Dask.
- ``"local:N"``: a private ``dask.distributed`` cluster of N one-thread worker processes on
  127.0.0.1 over mutually authenticated TLS, worker i on CUDA device ``i % n_gpus``; it lives
  as long as the ``TaskRunner``.
- ``"tls://HOST:PORT"``: a running Dask scheduler whose workers see the same paths and have
  this package; client certificates from Dask's configuration (``TLS_CONFIG_KEYS``), a missing
  one is a ``SchedulerError`` (``address_security``).
- ``"tcp://HOST:PORT"``: only with ``allow_insecure`` (``--allow-insecure-scheduler``,
  ``shared.allow_insecure_scheduler``).

Results equal the sequential run's; a task whose worker dies is rerun from its artefacts.

Design: docs/data_models_runs.md, "Tasks and schedulers".
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

LOGGER_NAME = "endoexplain.tasks"
SEQUENTIAL = "sequential"
log = logging.getLogger(LOGGER_NAME)

_LOCAL = re.compile(r"^local:(\d+)$")
_ADDRESS = re.compile(r"^(tcp|tls)://[^\s:/]+:(\d+)$")
# local:N beyond this many worker processes per core only thrashes (each worker is a process
# with its own torch); a typo such as local:100000 would otherwise start that many.
MAX_LOCAL_WORKERS_PER_CORE = 4
LOOPBACK = "127.0.0.1"
INSECURE_FLAG = "--allow-insecure-scheduler"
# Dask configuration keys a tls:// client reads its credentials from (distributed.Security).
TLS_CONFIG_KEYS = {"tls_ca_file": "distributed.comm.tls.ca-file",
                   "tls_client_cert": "distributed.comm.tls.client.cert",
                   "tls_client_key": "distributed.comm.tls.client.key"}


class SchedulerError(ValueError):
    """A scheduler setting that is not ``sequential``, ``local:N`` or a scheduler address, a
    plain ``tcp://`` address without the explicit opt-in, or ``tls://`` without certificates."""


@dataclass(frozen=True)
class SchedulerSpec:
    """A parsed scheduler setting: kind ``sequential`` | ``local`` | ``address``."""

    kind: str
    workers: int = 0
    address: str = ""

    def __str__(self) -> str:
        if self.kind == "local":
            return f"local:{self.workers}"
        return self.address if self.kind == "address" else SEQUENTIAL


def parse_scheduler(setting: str | None, *, allow_insecure: bool = False) -> SchedulerSpec:
    """``""``/``None``/``"sequential"`` -> in-process; ``"local:N"`` (1 <= N <=
    ``MAX_LOCAL_WORKERS_PER_CORE`` x the cores); ``"tls://HOST:PORT"`` (PORT 1 to 65535);
    ``"tcp://HOST:PORT"`` only with ``allow_insecure``.

    Raises ``SchedulerError`` naming the accepted forms for anything else, and naming
    ``--allow-insecure-scheduler`` for a ``tcp://`` address without it.
    """
    text = (setting or "").strip()
    if text in ("", SEQUENTIAL):
        return SchedulerSpec(SEQUENTIAL)
    local = _LOCAL.match(text)
    if local:
        workers = int(local.group(1))
        if workers < 1:
            raise SchedulerError(f"scheduler {text!r}: local:N needs N >= 1 worker processes")
        most = MAX_LOCAL_WORKERS_PER_CORE * (os.cpu_count() or 1)
        if workers > most:
            raise SchedulerError(f"scheduler {text!r}: at most {most} local worker processes "
                                 f"({MAX_LOCAL_WORKERS_PER_CORE} per core on this machine's "
                                 f"{os.cpu_count() or 1} cores)")
        return SchedulerSpec("local", workers=workers)
    address = _ADDRESS.match(text)
    if address:
        if not 1 <= int(address.group(2)) <= 65535:
            raise SchedulerError(f"scheduler {text!r}: port {int(address.group(2))} is not a "
                                 "TCP port (1 to 65535)")
        if text.startswith("tcp://") and not allow_insecure:
            raise SchedulerError(
                f"scheduler {text!r}: a tcp:// scheduler is unencrypted and unauthenticated (anyone "
                f"who reaches the port can run code on its workers); use tls://HOST:PORT with your "
                f"certificates (README, 'Scaling out'), or pass {INSECURE_FLAG} (profile: "
                f"shared.allow_insecure_scheduler: true) if the network is yours alone")
        return SchedulerSpec("address", address=text)
    raise SchedulerError(f"scheduler {text!r} is not understood: use '' or 'sequential' (in "
                         "process), 'local:N' (N local worker processes) or 'tls://HOST:PORT' "
                         "(a running Dask scheduler; tcp:// only with --allow-insecure-scheduler)")


def address_security(address: str):
    """The ``distributed.Security`` a client uses for ``address``: for ``tls://``, Dask's
    configuration (``TLS_CONFIG_KEYS``), checked to name a CA file, a client certificate and
    its key; for ``tcp://`` (allowed by the caller), none. Raises ``SchedulerError`` naming the
    missing keys and their environment variables instead of Dask's ssl_context error."""
    from distributed.security import Security

    if not address.startswith("tls://"):
        return Security()
    security = Security(require_encryption=True)  # reads distributed.comm.tls.* from dask.config
    missing = [key for field, key in TLS_CONFIG_KEYS.items() if not getattr(security, field)]
    if missing:
        variables = ", ".join("DASK_" + key.upper().replace(".", "__").replace("-", "_")
                              for key in missing)
        raise SchedulerError(f"scheduler {address!r}: no TLS credentials for the client; set the "
                             f"Dask config {', '.join(missing)} (environment: {variables})")
    # Load the files now, as the client will: a missing or malformed certificate stops the
    # run here, naming the file, not in stage 06 with an SSLError.
    try:
        security.get_connection_args("client")
    except (OSError, ValueError) as error:   # ssl.SSLError is an OSError
        named = [f"{key}={getattr(security, field)}" for field, key in TLS_CONFIG_KEYS.items()]
        raise SchedulerError(f"scheduler {address!r}: the client's TLS files cannot be loaded "
                             f"({' '.join(str(error).split())[:160]}); {', '.join(named)}") from None
    return security


def cuda_device_count() -> int:
    """Number of visible CUDA devices (0 without torch CUDA support)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def local_worker_environments(workers: int, n_gpus: int) -> list[dict[str, str]]:
    """Environment of each local worker process: its pinned GPU, tqdm bars off, PYTHONHASHSEED."""
    environments = []
    for index in range(workers):
        environment = {"TQDM_DISABLE": "1", "PYTHONHASHSEED": os.environ.get("PYTHONHASHSEED", "0")}
        if n_gpus:
            environment["CUDA_VISIBLE_DEVICES"] = str(index % n_gpus)
        environments.append(environment)
    return environments


def _start_local_cluster(workers: int):
    """A SpecCluster of ``workers`` Nanny-supervised one-thread processes, private to this
    process: every server listens on ``LOOPBACK`` over ``tls://`` with credentials made here
    (``Security.temporary``), which ``Client(cluster)`` connects with."""
    from distributed import Nanny, Scheduler, SpecCluster
    from distributed.security import Security

    # Plain tcp:// on a shared machine lets any local user submit code that runs as us.
    security = Security.temporary()

    n_gpus = cuda_device_count()
    if n_gpus and workers > n_gpus:
        log.warning("local:%d asks for more workers than the %d CUDA devices; devices are shared "
                    "round-robin", workers, n_gpus)
    private = {"host": LOOPBACK, "protocol": "tls://", "security": security}
    specs = {f"worker-{index}": {"cls": Nanny, "options": {
                 "nthreads": 1, "env": environment, "name": f"worker-{index}",
                 "silence_logs": logging.WARNING, **private}}
             for index, environment in enumerate(local_worker_environments(workers, n_gpus))}
    scheduler = {"cls": Scheduler, "options": {"dashboard_address": None, **private}}
    return SpecCluster(workers=specs, scheduler=scheduler, silence_logs=logging.WARNING,
                       name="endoexplain-local", security=security)


def run_task(function: Callable[..., Any], kwargs: dict[str, Any], label: str,
             torch_threads: int | None) -> Any:
    """What a worker runs for one unit: fix the torch thread count, log, call ``function``."""
    import torch

    if torch_threads:
        torch.set_num_threads(int(torch_threads))
    started = time.perf_counter()
    try:
        from distributed import get_worker

        worker = f"{get_worker().name} (pid {os.getpid()})"
    except (ImportError, ValueError):  # not inside a Dask worker
        worker = f"pid {os.getpid()}"
    log.info("%s: started on %s", label, worker)
    result = function(**kwargs)
    log.info("%s: finished on %s in %.1f s", label, worker, time.perf_counter() - started)
    return result


def _ensure_notebook_logging() -> None:
    """Print this module's log records (and those forwarded from workers) to stdout, which is
    the cell output in a notebook; idempotent."""
    if not any(getattr(handler, "_endoexplain_tasks", False) for handler in log.handlers):
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
        handler._endoexplain_tasks = True  # type: ignore[attr-defined]
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


class TaskRunner:
    """Maps a function over units of work on the chosen scheduler; use as a context manager.

    ``scheduler``, ``allow_insecure``: see ``parse_scheduler`` (a ``tcp://`` address is refused
    unless ``allow_insecure``). ``torch_threads``: intra-op threads every task uses
    (default: this process's ``torch.get_num_threads()``, which keeps results identical to
    the sequential run). ``progress``: a tqdm bar over tasks (finished / total).
    """

    def __init__(self, scheduler: str | None = "", *, allow_insecure: bool = False,
                 torch_threads: int | None = None, progress: bool = True) -> None:
        import torch

        self.spec = parse_scheduler(scheduler, allow_insecure=allow_insecure)
        self.torch_threads = torch_threads or torch.get_num_threads()
        self.progress = progress
        self.client = None
        self._cluster = None

    @property
    def is_sequential(self) -> bool:
        return self.spec.kind == SEQUENTIAL

    def __enter__(self) -> "TaskRunner":
        if self.is_sequential:
            return self
        from distributed import Client

        _ensure_notebook_logging()
        if self.spec.kind == "local":
            self._cluster = _start_local_cluster(self.spec.workers)
            self.client = Client(self._cluster)
        else:
            self.client = Client(self.spec.address, security=address_security(self.spec.address))
        self.client.forward_logging(LOGGER_NAME, level=logging.INFO)
        workers = self.client.scheduler_info().get("workers", {})
        log.info("scheduler %s: %d workers, %d torch threads per task", self.spec, len(workers),
                 self.torch_threads)
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        """Shut the client down (and the local cluster this runner started)."""
        if self.client is not None:
            self.client.close()
            self.client = None
        if self._cluster is not None:
            # Every result is in: a slow worker's exit WARNING is muted (docs/data_models_runs.md, "Tasks and schedulers").
            nanny_log = logging.getLogger("distributed.nanny")
            level = nanny_log.level
            nanny_log.setLevel(logging.ERROR)
            try:
                self._cluster.close()
            finally:
                nanny_log.setLevel(level)
            self._cluster = None

    def map(self, function: Callable[..., Any], calls: Sequence[dict[str, Any]],
            labels: Sequence[str]) -> list[Any]:
        """``[function(**kwargs) for kwargs in calls]``, results in the order of ``calls``.

        Sequential: called one by one in this process, exactly like the plain loop. On Dask:
        one task per call, all submitted at once; a worker that dies mid-task gets its task
        rescheduled (Dask's ``allowed-failures``); an exception in a task is raised here,
        naming the task, after the other tasks are cancelled.
        """
        calls, labels = list(calls), [str(label) for label in labels]
        if len(calls) != len(labels):
            raise ValueError(f"{len(calls)} calls but {len(labels)} labels")
        if self.is_sequential:
            return [function(**kwargs) for kwargs in calls]
        if self.client is None:
            raise RuntimeError("TaskRunner.map on Dask needs the runner entered (with TaskRunner(...))")
        from distributed import as_completed
        from endoexplain_core.progress import progress_bar

        name = getattr(function, "__name__", "task")
        futures = [self.client.submit(run_task, function, kwargs, label, self.torch_threads,
                                      key=f"{name}-{label}-{time.time_ns()}", pure=False)
                   for kwargs, label in zip(calls, labels)]
        by_key = {future.key: label for future, label in zip(futures, labels)}
        with progress_bar(total=len(futures), desc=name, unit="task", disable=not self.progress) as bar:
            for future in as_completed(futures):
                if future.status == "error":
                    for other in futures:
                        other.cancel()
                    error = future.exception()
                    raise RuntimeError(f"task {by_key[future.key]} ({name}) failed: "
                                       f"{type(error).__name__}: {error}") from error
                bar.update(1)
                bar.set_postfix_str(by_key[future.key])
        return self.client.gather(futures)


def task_map_for(runner: TaskRunner | None):
    """The ``task_map`` argument for the core loops: ``None`` (plain loop) when sequential."""
    if runner is None or runner.is_sequential:
        return None
    return runner.map
