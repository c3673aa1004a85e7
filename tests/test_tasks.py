"""Units of work as tasks (pipeline.tasks): scheduler settings, identical results on a local
Dask cluster, and a worker killed mid-task whose task is retried with the same result."""

import asyncio
import os
import signal
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from endoexplain_core import config
from endoexplain_core.analysis import audit, validity_gate
from endoexplain_core.methods import MAP_METHODS
from endoexplain_core.models import training
from endoexplain_core.pipeline import tasks
from tests.test_audit import crafted_case, CraftedModel, SIZE
from tests.test_training import DIGEST, IMAGE_SIZE, cohort  # noqa: F401 (fixture)


@pytest.mark.parametrize("setting, expected", [
    ("", tasks.SchedulerSpec("sequential")), (None, tasks.SchedulerSpec("sequential")),
    ("sequential", tasks.SchedulerSpec("sequential")),
    ("local:2", tasks.SchedulerSpec("local", workers=2)),
    ("tls://10.0.0.5:8786", tasks.SchedulerSpec("address", address="tls://10.0.0.5:8786")),
])
def test_scheduler_settings_are_parsed(setting, expected):
    assert tasks.parse_scheduler(setting) == expected


def test_tcp_scheduler_needs_the_explicit_insecure_opt_in():
    """tcp:// is unencrypted and unauthenticated: refused naming --allow-insecure-scheduler,
    before any connection; accepted with allow_insecure."""
    with pytest.raises(tasks.SchedulerError, match="--allow-insecure-scheduler"):
        tasks.parse_scheduler("tcp://10.0.0.5:8786")
    with pytest.raises(tasks.SchedulerError, match="--allow-insecure-scheduler"):
        tasks.TaskRunner("tcp://10.0.0.5:8786")
    assert tasks.parse_scheduler("tcp://10.0.0.5:8786", allow_insecure=True) == tasks.SchedulerSpec(
        "address", address="tcp://10.0.0.5:8786")


def client_tls_config(folder: Path) -> dict[str, str]:
    """Dask config keys naming a temporary CA, client certificate and key written to ``folder``
    (``distributed.security.Security.temporary``): loadable client TLS files."""
    from distributed.security import Security

    credentials = Security.temporary()
    files = {"distributed.comm.tls.ca-file": ("ca.pem", credentials.tls_ca_file),
             "distributed.comm.tls.client.cert": ("cert.pem", credentials.tls_client_cert),
             "distributed.comm.tls.client.key": ("key.pem", credentials.tls_client_key)}
    for name, text in files.values():
        (folder / name).write_text(text)
    return {key: str(folder / name) for key, (name, _) in files.items()}


def test_tls_address_takes_the_client_certificates_from_dask_config(tmp_path):
    """The user's certificates for a tls:// scheduler come from Dask's configuration (files or
    DASK_DISTRIBUTED__COMM__TLS__* variables); none configured is an error naming the keys."""
    import dask
    import distributed  # noqa: F401  (registers the distributed.* config keys set below)

    unset = {"distributed.comm.tls.ca-file": None, "distributed.comm.tls.client.cert": None,
             "distributed.comm.tls.client.key": None}
    with dask.config.set(unset):
        with pytest.raises(tasks.SchedulerError, match="distributed.comm.tls.ca-file.*"
                                                       "DASK_DISTRIBUTED__COMM__TLS__CA_FILE"):
            tasks.address_security("tls://10.0.0.5:8786")
    tls = client_tls_config(tmp_path)
    paths = {"ca": Path(tls["distributed.comm.tls.ca-file"]),
             "cert": Path(tls["distributed.comm.tls.client.cert"]),
             "key": Path(tls["distributed.comm.tls.client.key"])}
    with dask.config.set(tls):
        security = tasks.address_security("tls://10.0.0.5:8786")
    assert security.require_encryption and security.tls_client_cert == str(paths["cert"])
    assert security.get_connection_args("client")["ssl_context"] is not None
    # files that are named but missing or not certificates are refused now, naming them
    paths["cert"].write_text("not a certificate")
    for broken in ({"distributed.comm.tls.client.cert": str(paths["cert"])},
                   {"distributed.comm.tls.ca-file": str(tmp_path / "missing.pem")}):
        with dask.config.set({"distributed.comm.tls.ca-file": str(paths["ca"]),
                              "distributed.comm.tls.client.cert": str(paths["cert"]),
                              "distributed.comm.tls.client.key": str(paths["key"]), **broken}):
            with pytest.raises(tasks.SchedulerError, match="TLS files cannot be loaded"):
                tasks.address_security("tls://10.0.0.5:8786")


def _square(value):
    return value * value


def test_local_cluster_is_tls_on_loopback_and_refuses_clients_without_its_credentials():
    """local:2 listens on 127.0.0.1 over TLS with credentials made for it: a task runs; a
    client without credentials, one with other credentials and a plain tcp:// connection to
    the same port are all refused, so another user of the machine cannot submit code."""
    from distributed.security import Security

    with tasks.TaskRunner("local:2", progress=False) as runner:
        address = runner.client.scheduler.address
        assert address.startswith("tls://127.0.0.1:")
        workers = runner.client.scheduler_info()["workers"]  # worker address -> its info
        assert len(workers) == 2
        assert all(worker.startswith("tls://127.0.0.1:") and info["nanny"].startswith(
            "tls://127.0.0.1:") for worker, info in workers.items())
        assert runner.map(_square, [{"value": 7}, {"value": 3}], labels=["a", "b"]) == [49, 9]
        # The intruders' handshakes run at the comm level in their own event loop: a Client
        # would start a loop thread, whose 10-second start-up limit a loaded machine can miss
        # (an AssertionError that says nothing about the port; seen on a 2-core AMD EPYC).
        for intruder in ({}, Security.temporary().get_connection_args("client")):
            with pytest.raises((TypeError, OSError)):  # no ssl context / handshake refused
                asyncio.run(_handshake(address, intruder))
        with pytest.raises(OSError):  # CommClosedError / TimeoutError: the port speaks TLS only
            asyncio.run(_handshake(address.replace("tls://", "tcp://"), {}))


async def _handshake(address: str, connection_args: dict) -> None:
    """Connect as a client with ``connection_args`` and ask the scheduler who it is."""
    from distributed.comm import connect

    comm = await connect(address, timeout="5s", **connection_args)
    try:
        await comm.write({"op": "identity"})
        await asyncio.wait_for(comm.read(), timeout=5)
    finally:
        comm.abort()


@pytest.mark.parametrize("setting", ["local:0", "local", "dask", "tcp://host", "local:two"])
def test_bad_scheduler_settings_name_the_accepted_forms(setting):
    with pytest.raises(tasks.SchedulerError, match="local:N"):
        tasks.parse_scheduler(setting)


def test_workers_are_pinned_one_gpu_each_round_robin():
    environments = tasks.local_worker_environments(3, n_gpus=2)
    assert [e["CUDA_VISIBLE_DEVICES"] for e in environments] == ["0", "1", "0"]
    assert all("CUDA_VISIBLE_DEVICES" not in e for e in tasks.local_worker_environments(2, 0))


def test_sequential_runner_is_the_plain_loop_in_this_process():
    calls = [{"value": v} for v in (3, 1, 2)]
    with tasks.TaskRunner("") as runner:
        assert runner.client is None and tasks.task_map_for(runner) is None
        assert runner.map(_pid_and_square, calls, labels=["a", "b", "c"]) == [
            (os.getpid(), 9), (os.getpid(), 1), (os.getpid(), 4)]


def _pid_and_square(value):
    return os.getpid(), value * value


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.suffix != ".json"}


@pytest.mark.slow
def test_training_matrix_on_local_cluster_gives_byte_identical_checkpoints(cohort, tmp_path):  # noqa: F811
    root, manifest = cohort
    settings = {"epochs": 1, "batch_size": 8, "max_steps_per_epoch": 2, "learning_rate": 1e-3}
    arguments = (manifest, root)
    keywords = dict(manifest_digest=DIGEST, image_size=IMAGE_SIZE,
                    architectures=["efficientnet_b0", "resnet34"], training_seeds=[1129],
                    training_settings=settings, control_seed=1129, show_progress=False)
    sequential = training.train_matrix(*arguments, run_dir=tmp_path / "sequential", **keywords)
    with tasks.TaskRunner("local:2", progress=False) as runner:
        distributed = training.train_matrix(*arguments, run_dir=tmp_path / "dask",
                                            task_map=runner.map, **keywords)
        pids = set(runner.client.run(os.getpid).values())
    assert os.getpid() not in pids and len(pids) == 2
    assert [s["checkpoint_id"] for s in distributed] == [s["checkpoint_id"] for s in sequential]
    assert [s["val_auprc"] for s in distributed] == [s["val_auprc"] for s in sequential]
    first, second = _files(tmp_path / "sequential"), _files(tmp_path / "dask")
    assert sorted(first) == sorted(second) and len(first) >= 6
    # Checkpoints byte for byte. Resume states hold the process's Python ``random`` state,
    # which Dask's own threads advance in a worker; training never draws from it, so the
    # weights above are unaffected.
    weights = [name for name in first if ".resume." not in name]
    assert len(weights) == 3 and all(first[name] == second[name] for name in weights)


class KillOnceCases:
    """Audit cases that SIGKILL their own process after ``after`` cases, the first time only
    (a marker file records the kill), like a worker lost mid-task to the OOM killer."""

    def __init__(self, cases, marker: Path, after: int) -> None:
        self.cases, self.marker, self.after = cases, marker, after

    def __iter__(self):
        for index, case in enumerate(self.cases):
            if index == self.after and not self.marker.exists():
                self.marker.write_text(str(os.getpid()))
                os.kill(os.getpid(), signal.SIGKILL)
            yield case


def _audit(cases, folder: Path) -> dict:
    model = CraftedModel()
    return audit.audit_checkpoint(
        model, {"checkpoint_id": "crafted_s1", "arch": "crafted", "seed": 1}, 2.0, cases,
        dataset="unit", image_size=SIZE, table_path=folder / "audit.parquet",
        random_deletion_path=folder / "random.parquet", top_fraction=0.2, repetitions=3, batch_size=2,
        target_layer=("probe", model.probe))


@pytest.mark.slow
def test_killed_worker_task_is_retried_and_gives_identical_tables(tmp_path):
    cases = [crafted_case(f"case_{i}") for i in range(7)]
    _audit(cases, tmp_path / "sequential")
    marker = tmp_path / "killed.pid"
    calls = [{"cases": KillOnceCases(cases, marker, after=5), "folder": tmp_path / "dask"}]
    with tasks.TaskRunner("local:2", progress=False) as runner:
        (summary,) = runner.map(_audit, calls, labels=["unit/crafted_s1"])
        survivors = set(runner.client.run(os.getpid).values())
    killed = int(marker.read_text())
    assert killed != os.getpid() and killed not in survivors  # a worker really died mid-task
    assert summary["n_audited"] == 7
    # The first attempt had streamed two batches into its temporary file; the retry rewrote it.
    for name in ("audit.parquet", "random.parquet"):
        assert (tmp_path / "dask" / name).read_bytes() == (tmp_path / "sequential" / name).read_bytes()
    table = pd.read_parquet(tmp_path / "dask" / "audit.parquet")
    assert not table.duplicated(["sample_id", "method"]).any() and len(table) == 7 * len(MAP_METHODS)
    assert not list((tmp_path / "dask").glob("*.partial"))
    assert np.isfinite(table["iou"]).all()


@pytest.mark.slow
@pytest.mark.parametrize("control_per_replicate", [True, False])
def test_gate_replicates_as_tasks_give_the_sequential_tables(tmp_path, control_per_replicate):
    """Gate replicates are independent draws: on a local cluster (one task per replicate, or
    after the first when one shuffled control is reused) the case rows, model facts and gate
    table equal the plain loop's."""
    section = config.ValidityGateSettings.model_construct(   # tiny, below the profile minima
        train_images=8, val_images=8, pool_images=4, steps=2, batch_size=4,
        random_deletion_repetitions=1, replicate_seeds=[1, 2, 3], untrained_initialisations=2,
        shuffled_control_per_replicate=control_per_replicate)
    settings = validity_gate.GateSettings(section, image_size=64, channels_last=True)
    keywords = dict(arch="resnet18", settings=settings, batch_size=4, top_fraction=0.20)
    sequential = validity_gate.run_gate(tmp_path / "sequential", **keywords)
    with tasks.TaskRunner("local:2", progress=False) as runner:
        distributed = validity_gate.run_gate(tmp_path / "dask", task_map=runner.map, **keywords)
    for key in ("cases", "models", "gate", "clauses"):
        pd.testing.assert_frame_equal(distributed[key].drop(columns="seconds", errors="ignore"),
                                      sequential[key].drop(columns="seconds", errors="ignore"))
    assert sorted(distributed["cases"]["gate_seed"].unique()) == [1, 2, 3]
    shuffled_seeds = distributed["models"].query("model == 'shuffled'")["trained_with_seed"].tolist()
    assert shuffled_seeds == ([1, 2, 3] if control_per_replicate else [1, 1, 1])


def test_gate_refuses_a_callback_with_tasks(tmp_path):
    section = config.ValidityGateSettings()
    settings = validity_gate.GateSettings(section, image_size=64, channels_last=True)
    with pytest.raises(ValueError, match="on_replicate"):
        validity_gate.run_gate(tmp_path, arch="resnet18", settings=settings, batch_size=4,
                               top_fraction=0.2, task_map=lambda *a: [], on_replicate=print)
