"""The profile schema: every key checked before any work, defaults in one place, stage scoping."""

from __future__ import annotations

import ast
import copy
import re
from pathlib import Path

import dask
import pytest
import yaml

from endoexplain_core import config
from endoexplain_core.pipeline import orchestrator, parameters

SMOKE = yaml.safe_load(config.profile_path("smoke").read_text())


def write_profile(tmp_path, mutate) -> str:
    raw = copy.deepcopy(SMOKE)
    mutate(raw)
    path = tmp_path / "edited.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


@pytest.mark.parametrize("name", config.PROFILES)
def test_committed_profiles_validate(name):
    profile = config.load_profile(name)
    assert set(profile.stages) == set(config.STAGE_SETTINGS)


@pytest.mark.parametrize("mutate, message", [
    (lambda raw: raw["shared"].update(top_fraktion=0.2),
     "shared.top_fraktion: unknown key (did you mean 'top_fraction'?)"),
    (lambda raw: raw["stages"]["04_spatial_audit"].update(bootstrap_replicate=10),
     "stages.04_spatial_audit.bootstrap_replicate: unknown key (did you mean 'bootstrap_replicates'?)"),
    (lambda raw: raw["stages"]["01_training"]["training_settings"].update(epoch=3),
     "training_settings.epoch: unknown key (did you mean 'epochs'?)"),
    (lambda raw: raw["stages"]["01_training"]["arch_overrides"].update(resnet34={"lr": 0.1}),
     "arch_overrides.resnet34.lr: unknown key"),
    (lambda raw: raw["shared"].update(top_fraction=-0.2), "shared.top_fraction: Input should be greater than 0"),
    (lambda raw: raw["shared"].update(score_threshold=1.5), "shared.score_threshold: Input should be less than 1"),
    (lambda raw: raw["shared"].update(architectures=["vgg11"]), "shared.architectures.0: Input should be"),
    (lambda raw: raw["stages"]["00_roles"].update(split_fractions=[0.8, 0.15, 0.15]),
     "stages.00_roles.split_fractions: need three positive fractions summing to 1"),
    (lambda raw: raw["stages"]["05_robustness"].update(score_thresholds=[0.5, 1.0]),
     "thresholds must lie in (0, 1)"),
    (lambda raw: raw["stages"].update({"04_spatial_audt": {}}),
     "stages.04_spatial_audt: unknown stage (did you mean '04_spatial_audit'?)"),
    (lambda raw: raw.update(sharde={}), "unknown top-level key 'sharde' (did you mean 'shared'?)"),
])
def test_bad_profiles_are_rejected_naming_the_key(tmp_path, mutate, message):
    path = write_profile(tmp_path, mutate)
    with pytest.raises(config.ProfileError) as error:
        config.load_profile(path)
    assert message in str(error.value)
    assert str(path) in str(error.value)


def test_misspelt_key_stops_the_run_before_any_work(tmp_path):
    path = write_profile(tmp_path, lambda raw: raw["shared"].update(scor_threshold=0.9))
    output = tmp_path / "out"
    assert orchestrator.main(["--profile", path, "--output-root", str(output)]) == 2
    assert not (output / "runs" / "edited").exists() and not (output / "figures").exists()


def test_missing_keys_take_the_schema_default(tmp_path):
    path = write_profile(tmp_path, lambda raw: raw["stages"]["04_spatial_audit"].pop("bootstrap_replicates"))
    profile = config.load_profile(path)
    assert profile.stages["04_spatial_audit"].bootstrap_replicates == \
        config.SpatialAuditSettings.model_fields["bootstrap_replicates"].default


def test_stages_receive_only_the_shared_keys_they_use():
    profile = config.load_profile("smoke")
    roles = config.stage_parameters(profile, "00_roles")
    assert "seed" in roles and "score_threshold" not in roles and "top_fraction" not in roles
    training = config.stage_parameters(profile, "01_training")
    assert "score_threshold" not in training and "top_fraction" not in training
    audit = config.stage_parameters(profile, "04_spatial_audit")
    assert audit["top_fraction"] == 0.2 and audit["score_threshold"] == 0.9


def _digests(profile_path: str) -> dict[str, str]:
    """Stage digests as run_pipeline computes them, without running anything."""
    notebooks = orchestrator.discover_stages()
    profile = config.load_profile(profile_path, [n.stem for n in notebooks])
    digests, upstream = {}, "inputs"
    for notebook in notebooks:
        parameters = {k: v for k, v in config.stage_parameters(profile, notebook.stem).items()
                      if k not in config.EXECUTION_KEYS}
        upstream = orchestrator.stage_digest(
            notebook, parameters,
            orchestrator.core_code_digest(orchestrator.core_modules_used(notebook)), upstream)
        digests[notebook.stem] = upstream
    return digests


def test_changing_score_threshold_leaves_roles_training_and_calibration_alone(tmp_path):
    before = _digests(str(config.profile_path("smoke")))
    after = _digests(write_profile(tmp_path, lambda raw: raw["shared"].update(score_threshold=0.8)))
    changed = sorted(stage for stage in before if before[stage] != after[stage])
    assert changed and changed[0] > "02_calibration"
    assert {"00_roles", "01_training", "02_calibration"}.isdisjoint(changed)


def test_changing_top_fraction_reruns_from_the_first_stage_that_uses_it(tmp_path):
    before = _digests(str(config.profile_path("smoke")))
    after = _digests(write_profile(tmp_path, lambda raw: raw["shared"].update(top_fraction=0.1)))
    users = [s for s, model in config.STAGE_SETTINGS.items() if "top_fraction" in model.uses_shared]
    changed = sorted(stage for stage in before if before[stage] != after[stage])
    assert changed[0] == min(users)
    assert all(stage >= min(users) for stage in changed)


def test_a_stage_code_digest_covers_the_modules_it_imports():
    notebooks = {n.stem: n for n in orchestrator.discover_stages()}
    roles = {p.name for p in orchestrator.core_modules_used(notebooks["00_roles"])}
    audit = {p.relative_to(orchestrator.CORE_DIR).as_posix()
             for p in orchestrator.core_modules_used(notebooks["04_spatial_audit"])}
    assert "synthetic.py" in roles and "cams.py" not in roles
    assert {"kernels/cams.py", "kernels/threshold.py", "analysis/audit.py"} <= audit


def declared_parameters(notebook: Path) -> dict:
    """Names and literal values assigned in a notebook's parameters cell."""
    source = "".join(parameters.parameters_cell(notebook)["source"])
    return {node.targets[0].id: ast.literal_eval(node.value) for node in ast.parse(source).body
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)}


@pytest.mark.parametrize("notebook", orchestrator.discover_stages(), ids=lambda p: p.stem)
def test_notebook_parameters_cell_matches_the_schema(notebook):
    """Same names and the smoke profile's values (regenerate: scripts/sync_parameters.py)."""
    assert notebook.stem in config.STAGE_SETTINGS, f"{notebook.name} has no settings model"
    assert declared_parameters(notebook) == parameters.expected_parameters(notebook.stem)


@pytest.mark.parametrize("notebook", orchestrator.discover_stages(), ids=lambda p: p.stem)
def test_notebook_title_carries_its_stage_number(notebook):
    """The heading a reader sees ("# 04 · ...") names the file's number (stale after renumbering)."""
    import nbformat
    title = nbformat.read(notebook, as_version=4).cells[0].source.splitlines()[0]
    assert title.startswith(f"# {notebook.stem[:2]} · "), f"{notebook.name}: title {title!r}"


def test_where_tasks_run_is_not_part_of_any_stage_digest(tmp_path):
    before = _digests(str(config.profile_path("smoke")))
    after = _digests(write_profile(tmp_path, lambda raw: raw["shared"].update(scheduler="local:2")))
    # _digests hashes every parameter; the orchestrator leaves EXECUTION_KEYS out, so compare
    # after dropping them the same way.
    assert "scheduler" in config.EXECUTION_KEYS
    profile = config.load_profile(write_profile(tmp_path, lambda raw: raw["shared"].update(scheduler="local:2")))
    assert config.stage_parameters(profile, "01_training")["scheduler"] == "local:2"
    assert before == after


@pytest.mark.parametrize("scheduler", ["local:0", "local:two", "slurm"])
def test_bad_scheduler_is_rejected(tmp_path, scheduler):
    path = write_profile(tmp_path, lambda raw: raw["shared"].update(scheduler=scheduler))
    with pytest.raises(config.ProfileError, match="shared.scheduler"):
        config.load_profile(path)
    assert orchestrator.main(["--profile", "smoke", "--scheduler", scheduler,
                              "--output-root", str(tmp_path / "out")]) == 2


INSECURE = "tcp://10.0.0.5:8786"


def test_tcp_scheduler_is_refused_unless_insecure_is_allowed(tmp_path, capsys, monkeypatch):
    """A plain tcp:// scheduler (unencrypted, unauthenticated) stops the run before any work,
    exit 2, in one line naming the setting and --allow-insecure-scheduler; the flag or the
    profile key shared.allow_insecure_scheduler accepts it (validation only: no scheduler)."""
    assert orchestrator.main(["--profile", "smoke", "--scheduler", INSECURE,
                              "--output-root", str(tmp_path / "out")]) == 2
    message = capsys.readouterr().err.strip()
    assert len(message.splitlines()) == 1 and "--scheduler" in message
    assert "--allow-insecure-scheduler" in message and "tls://" in message
    in_profile = write_profile(tmp_path, lambda raw: raw["shared"].update(scheduler=INSECURE))
    assert orchestrator.main(["--profile", in_profile, "--output-root", str(tmp_path / "out")]) == 2
    message = capsys.readouterr().err.strip()
    assert "shared.scheduler" in message and "--allow-insecure-scheduler" in message
    assert not (tmp_path / "out" / "runs" / "edited").exists()  # nothing ran

    # Accepted with the flag (main's plumbing, run_pipeline's check; the stages are not run) ...
    checked = []

    def check_only(profile, *, scheduler, allow_insecure_scheduler, **_):
        orchestrator.check_scheduler(config.load_profile(profile), scheduler, allow_insecure_scheduler)
        checked.append((scheduler, allow_insecure_scheduler))
        return {"profile": "smoke", "status": "complete", "wall_seconds": 0.0}

    monkeypatch.setattr(orchestrator, "run_pipeline", check_only)
    assert orchestrator.main(["--profile", "smoke", "--scheduler", INSECURE,
                              "--allow-insecure-scheduler", "--output-root", str(tmp_path / "out")]) == 0
    assert checked == [(INSECURE, True)]
    # ... or with the profile key, which the stages that submit tasks receive.
    allowed = config.load_profile(write_profile(tmp_path, lambda raw: raw["shared"].update(
        scheduler=INSECURE, allow_insecure_scheduler=True)))
    orchestrator.check_scheduler(allowed, None, allow_insecure=False)
    assert config.stage_parameters(allowed, "01_training")["allow_insecure_scheduler"] is True
    assert "allow_insecure_scheduler" in config.EXECUTION_KEYS  # switching it reruns nothing
    # tls:// needs no opt-in, but the client certificates in Dask's config, loadable files.
    with dask.config.set({"distributed.comm.tls.ca-file": None}):
        with pytest.raises(ValueError, match="--scheduler.*distributed.comm.tls.ca-file"):
            orchestrator.check_scheduler(config.load_profile("smoke"), "tls://10.0.0.5:8786", False)
    with dask.config.set({"distributed.comm.tls.ca-file": "ca.pem",
                          "distributed.comm.tls.client.cert": "cert.pem",
                          "distributed.comm.tls.client.key": "key.pem"}):
        with pytest.raises(ValueError, match="--scheduler.*TLS files cannot be loaded"):
            orchestrator.check_scheduler(config.load_profile("smoke"), "tls://10.0.0.5:8786", False)
    from tests.test_tasks import client_tls_config
    with dask.config.set(client_tls_config(tmp_path)):
        orchestrator.check_scheduler(config.load_profile("smoke"), "tls://10.0.0.5:8786", False)


def test_channels_last_has_one_home_read_by_training_and_the_gate():
    users = sorted(s for s, model in config.STAGE_SETTINGS.items() if "channels_last" in model.uses_shared)
    assert users == ["01_training", "03_validity_gate"]
    assert all("channels_last" not in model.model_fields for model in config.STAGE_SETTINGS.values())


def test_localisation_scales_and_the_decision_threshold_have_one_shared_home():
    """07 and 08 read one set of pointing, DoG and energy scales; 02 and 08 one decision
    threshold. No stage section defines any of them again."""
    users = {key: sorted(s for s, model in config.STAGE_SETTINGS.items() if key in model.uses_shared)
             for key in ("localisation", "decision_threshold")}
    assert users == {"localisation": ["07_extended_localisation", "08_faithfulness"],
                     "decision_threshold": ["02_calibration", "08_faithfulness"]}
    shared_only = {*config.LocalisationSettings.model_fields, "decision_threshold", "audit_batch_size"}
    for model in config.STAGE_SETTINGS.values():
        assert not set(model.model_fields) & shared_only, model.__name__
    scales = config.load_profile("smoke").shared.localisation
    assert scales.pixels(100) == pytest.approx({"dog_sigma_small_px": 1.0, "dog_sigma_large_px": 8.0,
                                                "radius_px": 3.0, "smooth_sigma_px": 1.0})


def test_no_stage_key_repeats_another_stages_key_without_a_reason():
    """A key name in two stage sections is one quantity with two homes, unless it is a
    per-stage budget or choice: memory per batch, bootstrap replicates, random deletions of
    that stage's own pool (gate pool, audit pool, external cohorts), the cohorts it scores."""
    per_stage = {"bootstrap_replicates", "random_deletion_repetitions",
                 "external_cohorts"}
    seen: dict[str, list[str]] = {}
    for stage, model in config.STAGE_SETTINGS.items():
        for key in model.model_fields:
            seen.setdefault(key, []).append(stage)
    repeated = {k: v for k, v in seen.items() if len(v) > 1 and k not in per_stage}
    assert repeated == {}


@pytest.mark.parametrize("stage, key", [("07_extended_localisation", "energy_alpha"),
                                        ("02_calibration", "decision_threshold"),
                                        ("05_robustness", "audit_batch_size")])
def test_a_shared_key_set_in_a_stage_section_is_refused(tmp_path, stage, key):
    path = write_profile(tmp_path, lambda raw: raw["stages"][stage].update({key: 0.5}))
    with pytest.raises(config.ProfileError, match=f"stages.{stage}.{key}: unknown key"):
        config.load_profile(path)


def test_the_audits_and_the_case_browser_read_one_batch_size():
    """The browser redraws 04's and 06's maps to the last bit only in the audits' batches: one key
    (01's validation map check computes the same maps, so it reads the same key)."""
    users = sorted(s for s, model in config.STAGE_SETTINGS.items() if "audit_batch_size" in model.uses_shared)
    assert users == ["01_training", "04_spatial_audit", "05_robustness", "06_transfer", "07_extended_localisation",
                     "09_figures"]
    assert all("batch_size" not in key or key in ("pool_batch_size", "faithfulness_batch_size", "batch_size")
               for model in config.STAGE_SETTINGS.values() for key in model.model_fields)


def test_stage_section_rebuilds_a_notebooks_typed_section_and_refuses_gaps():
    profile = config.load_profile("smoke")
    parameters = config.stage_parameters(profile, "03_validity_gate")
    section = config.stage_section("03_validity_gate", {**parameters, "unrelated": 1})
    assert section == profile.stages["03_validity_gate"]
    with pytest.raises(config.ProfileError, match="03_validity_gate: parameters lack margin"):
        config.stage_section("03_validity_gate", {k: v for k, v in parameters.items() if k != "margin"})
    with pytest.raises(config.ProfileError, match="stages.03_validity_gate.margin"):
        config.stage_section("03_validity_gate", {**parameters, "margin": 2.0})


SMOKE_TEXT = (config.CONFIG_DIR / "smoke.yaml").read_text()


@pytest.mark.parametrize("text, words", [
    (SMOKE_TEXT.replace("  seed: 20260721", "  seed: &s 20260721", 1) + "x: *s\n", ["alias *s"]),
    (SMOKE_TEXT.replace("  image_size: 128", "  image_size: 128\n  image_size: 96", 1), ["duplicate key 'image_size'"]),
    (SMOKE_TEXT.replace("  image_size: 128", "  image_size: '128'", 1), ["shared.image_size", "str '128'"]),
    (SMOKE_TEXT.replace("  channels_last: true", "  channels_last: no", 1), ["shared.channels_last", "str 'no'"]),
    (SMOKE_TEXT.replace("  score_threshold: 0.90", "  score_threshold: .nan", 1), ["shared.score_threshold"]),
    (SMOKE_TEXT.replace("      learning_rate: 0.001", "      learning_rate: .inf", 1), ["learning_rate", "finite"]),
], ids=["alias", "duplicate_key", "string_for_int", "yaml11_bool", "nan", "inf_learning_rate"])
def test_profile_yaml_surprises_are_refused_in_one_short_line(tmp_path, text, words):
    path = tmp_path / "odd.yaml"
    path.write_text(text)
    with pytest.raises(config.ProfileError) as refused:
        config.load_profile(str(path))
    message = str(refused.value)
    assert len(message.splitlines()) == 1 and len(message) < 400, message
    for word in words:
        assert word in message, (word, message)


def test_error_messages_show_a_short_typed_prefix_of_a_huge_value():
    assert config.short_value("x" * 10_000) == "str '" + "x" * 39 + "..."
    assert config.short_value(3) == "int 3"


# --- --set overrides -----------------------------------------------------------------------------

def test_set_overrides_are_parsed_and_validated_like_the_file():
    profile = config.load_profile("smoke", overrides=["01_training.training_settings.epochs=2",
                                                      "shared.top_fraction=0.25",
                                                      "05_robustness.score_thresholds=[0.8, 0.9]"])
    assert profile.stages["01_training"].training_settings["epochs"] == 2
    assert profile.stages["01_training"].training_settings["batch_size"] == \
        config.load_profile("smoke").stages["01_training"].training_settings["batch_size"]  # the rest kept
    assert profile.shared.top_fraction == 0.25 and profile.stages["05_robustness"].score_thresholds == [0.8, 0.9]
    assert profile.overrides[0] == "01_training.training_settings.epochs=2"
    # the YAML rules of the file hold for --set values too: '128' is a string, 'no' is not a bool
    for text, words in (("shared.image_size='128'", "valid integer"), ("shared.channels_last=no", "boolean"),
                        ("shared.image_size=.inf", "image_size"), ("shared.image_siz=128", "did you mean 'image_size'"),
                        ("shared.image_size", "SECTION.KEY=VALUE"), ("03_validity_gate.steps=[1", "not valid profile YAML"),
                        ("01_trainng.x=1", "did you mean '01_training'"),
                        ("01_training.training_settings.epoch=2", "epoch")):
        with pytest.raises(config.ProfileError, match=re.escape(words)):
            config.load_profile("smoke", overrides=[text])


def test_a_set_override_changes_exactly_the_digests_of_the_stages_that_read_it():
    base = config.load_profile("smoke")
    changed = config.load_profile("smoke", overrides=["09_figures.table_digits=4"])
    differs = [stage for stage in config.STAGE_SETTINGS
               if config.stage_parameters(base, stage) != config.stage_parameters(changed, stage)]
    assert differs == ["09_figures"]
    shared = config.load_profile("smoke", overrides=["shared.score_threshold=0.8"])
    readers = [stage for stage in config.STAGE_SETTINGS
               if config.stage_parameters(base, stage) != config.stage_parameters(shared, stage)]
    assert readers == [s for s, model in config.STAGE_SETTINGS.items() if "score_threshold" in model.uses_shared]
    from endoexplain_core.pipeline import orchestrator
    assert orchestrator.stage_overrides(shared, "00_roles") == []
    assert orchestrator.stage_overrides(shared, "05_robustness") == ["shared.score_threshold=0.8"]


def test_set_file_lines_skip_comments_and_blanks_and_a_missing_file_is_named(tmp_path):
    sets = tmp_path / "rehearsal.sets"
    sets.write_text("# a comment\n\nshared.image_size=128\n   # indented comment\n 03_validity_gate.steps=4 \n")
    assert config.read_set_file(sets) == ["shared.image_size=128", "03_validity_gate.steps=4"]
    with pytest.raises(config.ProfileError, match="nowhere.sets"):
        config.read_set_file(tmp_path / "nowhere.sets")


def test_generated_data_roots_count_as_synthetic(tmp_path):
    assert config.is_synthetic_data("") and config.is_synthetic_data(None)
    assert not config.is_synthetic_data(tmp_path)                        # real data: no marker
    (tmp_path / config.SYNTHETIC_MARKER).write_text("{}")
    assert config.is_synthetic_data(str(tmp_path))                       # the mirror carries it


def test_the_paper_reference_manifest_is_refused_for_generated_data(tmp_path, capsys):
    (tmp_path / config.SYNTHETIC_MARKER).write_text("{}")
    with pytest.raises(ValueError, match="--manifest-reference"):
        orchestrator.manifest_reference_dir("paper", str(tmp_path), None)
    assert orchestrator.manifest_reference_dir("paper", str(tmp_path), tmp_path / "ref") == tmp_path / "ref"
    assert orchestrator.manifest_reference_dir("smoke", "", None).parts[-2:] == ("data_manifest", "smoke")
    with pytest.raises(ValueError, match="data_manifest/smoke"):          # the embedded reference
        orchestrator.manifest_reference_dir("smoke", "", None, adopt=True, mirror_layout=True)
    with pytest.raises(ValueError, match="generated data root"):
        orchestrator.manifest_reference_dir("default", str(tmp_path), None, adopt=True)
    assert orchestrator.main(["--profile", "smoke", "--set-file", str(tmp_path / "missing.sets")]) == 2
    assert "missing.sets" in capsys.readouterr().err


def test_a_docstring_or_comment_edit_leaves_every_stage_digest_valid(tmp_path):
    """Stage digests hash what the core computes, not its wording: editing a docstring, a
    comment or a line break in a copy of the core leaves every stage's code digest unchanged;
    changing one constant changes the digest of exactly the stages that import that module."""
    import shutil

    core = tmp_path / "endoexplain_core"
    shutil.copytree(orchestrator.CORE_DIR, core, ignore=shutil.ignore_patterns("__pycache__"))
    notebooks = orchestrator.discover_stages()

    def digests():
        return {n.stem: orchestrator.core_code_digest(orchestrator.core_modules_used(n, core), core)
                for n in notebooks}

    before = digests()
    module = core / "kernels" / "metrics.py"
    source = module.read_text()
    worded = source.replace('"""', '"""A reworded docstring. ', 1) + "\n# a new comment\n\n"
    function_doc = worded.index("def ")
    worded = worded[:function_doc] + "# why, briefly\n" + worded[function_doc:]
    module.write_text(worded)
    assert digests() == before
    module.write_text(source + "\nEXTRA_CONSTANT = 1\n")
    after = digests()
    users = {n.stem for n in notebooks if core / "kernels" / "metrics.py" in orchestrator.core_modules_used(n, core)}
    assert users and {stage for stage in before if after[stage] != before[stage]} == users


def test_code_fingerprint_drops_docstrings_only():
    plain = orchestrator.code_fingerprint("def f(x):\n    return x + 1\n")
    assert orchestrator.code_fingerprint('def f(x):\n    """Add one."""\n    # comment\n    return x + 1\n') == plain
    assert orchestrator.code_fingerprint("def f(x):\n    return x + 2\n") != plain
    # a string that is not the first statement is code (e.g. a message), not a docstring
    assert orchestrator.code_fingerprint('def f(x):\n    y = 1\n    "text"\n    return x + 1\n') != plain
    assert orchestrator.code_fingerprint('def f():\n    """Only a docstring."""\n') == orchestrator.code_fingerprint("def f():\n    pass\n")
