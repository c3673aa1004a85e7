"""The run layout: one owner of every run path, the registry, the primary and temperatures."""

import re
from pathlib import Path

import pandas as pd
import pytest

from endoexplain_core.run_layout import RUN_FOLDER, RunLayout

DOCS = Path(__file__).resolve().parent.parent / "docs" / "architecture.md"


def write_run(run_dir: Path, is_primary=(False, True), temperatures=(("efficientnet_b0_s2089", 1.7),)):
    layout = RunLayout(run_dir)
    layout.checkpoints_dir.mkdir(parents=True)
    layout.calibration_dir.mkdir(parents=True)
    pd.DataFrame({"checkpoint_id": ["efficientnet_b0_s1129", "efficientnet_b0_s2089"],
                  "path": ["checkpoints/a.safetensors", "checkpoints/b.safetensors"],
                  "is_primary": list(is_primary)}).to_csv(layout.registry, index=False)
    pd.DataFrame(list(temperatures), columns=["checkpoint_id", "temperature"]).to_csv(
        layout.temperatures, index=False)
    return layout


def test_primary_checkpoint_reads_registry_and_temperature(tmp_path):
    layout = write_run(tmp_path)
    primary = layout.primary_checkpoint()
    assert primary["checkpoint_id"] == "efficientnet_b0_s2089" and primary["temperature"] == 1.7
    assert primary["path"] == str(tmp_path / "checkpoints" / "b.safetensors")
    assert layout.primary_id() == "efficientnet_b0_s2089"
    assert layout.checkpoint_file("efficientnet_b0_s1129") == tmp_path / "checkpoints" / "a.safetensors"
    assert layout.read_registry()["is_primary"].tolist() == [False, True]


@pytest.mark.parametrize("is_primary", [(False, False), (True, True)])
def test_a_registry_without_exactly_one_primary_is_refused(tmp_path, is_primary):
    layout = write_run(tmp_path, is_primary=is_primary)
    with pytest.raises(ValueError, match="registry.csv: expected exactly one primary"):
        layout.primary_id()


def test_missing_records_name_the_file_and_the_stage_that_writes_it(tmp_path):
    layout = RunLayout(tmp_path)
    with pytest.raises(FileNotFoundError, match="registry.csv does not exist: run 01_training"):
        layout.read_registry()
    with pytest.raises(FileNotFoundError, match="temperatures.csv does not exist: run 02_calibration"):
        layout.temperature("a_s1")
    with pytest.raises(FileNotFoundError, match="manifest.sha256 does not exist: run 00_roles"):
        layout.manifest_digest()
    write_run(tmp_path)
    with pytest.raises(KeyError, match="not_there is not in .*registry.csv"):
        layout.registry_entry("not_there")


def test_temperature_names_the_file_and_checkpoint(tmp_path):
    layout = write_run(tmp_path, temperatures=(("a_s1", 0.8), ("bad_s1", 0.0)))
    assert layout.temperature("a_s1") == 0.8
    with pytest.raises(KeyError, match="b_s2.*no fitted temperature"):
        layout.temperature("b_s2")
    with pytest.raises(ValueError, match="temperature of bad_s1 is 0.0, not > 0"):
        layout.temperature("bad_s1")


def test_audit_paths_follow_the_documented_patterns(tmp_path):
    paths = RunLayout(tmp_path).audit_paths("etis", "resnet34_s1")
    assert {k: p.relative_to(tmp_path).as_posix() for k, p in paths.items()} == {
        "table": "audit/etis/resnet34_s1.parquet",
        "random_deletion": "audit/etis/resnet34_s1_random_deletion.parquet",
        "summary": "audit/etis/resnet34_s1_summary.json",
        "negatives": "audit/etis/resnet34_s1_negatives.parquet"}
    for path in paths.values():
        pattern = path.relative_to(tmp_path).as_posix().replace("etis", "<dataset>").replace(
            "resnet34_s1", "<checkpoint_id>")
        assert pattern in RUN_FOLDER


def documented_run_folder() -> dict[str, str]:
    """path -> "written by" of the run-folder table in docs/architecture.md."""
    text = DOCS.read_text()
    section = text[text.index("### Run folder"):]
    section = section[:section.index("\n\n", section.index("|------"))]
    rows = {}
    for line in section.splitlines():
        match = re.match(r"\| `([^`]+)`[^|]*\| ([^|]+) \|", line)
        if match:
            rows[match.group(1)] = match.group(2).strip()
    return rows


def test_the_architecture_docs_run_folder_table_is_the_layouts():
    documented = documented_run_folder()
    assert list(documented) == list(RUN_FOLDER), "docs/architecture.md run-folder rows differ from RUN_FOLDER"
    assert documented == RUN_FOLDER


def test_every_layout_path_is_documented(tmp_path):
    """Each path property of RunLayout is a RUN_FOLDER row (a file) or the folder of one."""
    layout = RunLayout(tmp_path)
    names = [n for n, v in vars(RunLayout).items() if isinstance(v, property)]
    assert len(names) >= 15
    for name in names:
        relative = getattr(layout, name).relative_to(tmp_path).as_posix()
        if Path(relative).suffix:
            assert relative in RUN_FOLDER, f"RunLayout.{name} ({relative}) is not in RUN_FOLDER"
        else:
            assert any(p.startswith(relative + "/") for p in RUN_FOLDER), \
                f"RunLayout.{name} ({relative}/) holds no RUN_FOLDER row"
