"""Hashing, hash groups, study roles, the manifest and its reference, Table 2."""

import hashlib

import imagehash
import numpy as np
import pandas as pd
import pytest
from PIL import Image

from endoexplain_core.data import roles
from endoexplain_core.data.imageio import ImageReadError
from endoexplain_core.config import RolesSettings

SPLIT = RolesSettings().split_fractions  # the profiles' train/val/test shares


def _frame(seed: int, size: int = 32) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)


@pytest.fixture
def crafted(tmp_path):
    """a.png; a_copy.png (same bytes); a_near.png (one pixel nudged: other bytes, same
    average hash); b.png (a different picture)."""
    a = _frame(1)
    Image.fromarray(a).save(tmp_path / "a.png")
    (tmp_path / "a_copy.png").write_bytes((tmp_path / "a.png").read_bytes())
    nudged = a.copy()
    nudged[0, 0] = nudged[0, 0] ^ 1
    Image.fromarray(nudged).save(tmp_path / "a_near.png")
    Image.fromarray(_frame(2)).save(tmp_path / "b.png")
    return [tmp_path / n for n in ("a.png", "a_copy.png", "a_near.png", "b.png")]


def test_hash_files_matches_hashlib_and_imagehash(crafted):
    table = roles.hash_files(crafted, progress=False)
    for path, row in zip(crafted, table.itertuples()):
        assert row.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
        assert row.ahash == str(imagehash.average_hash(Image.open(path), hash_size=16))
        assert len(row.ahash) == 64 and (row.width, row.height) == (32, 32)
    sha, ahash = table["sha256"], table["ahash"]
    assert sha[0] == sha[1] != sha[2] and ahash[0] == ahash[2] != ahash[3]


def test_hash_files_names_unreadable_file(crafted, tmp_path):
    (tmp_path / "bad.jpg").write_bytes(b"\xff\xd8garbage")
    with pytest.raises(ImageReadError, match="bad.jpg"):
        roles.hash_files([*crafted, tmp_path / "bad.jpg"], progress=False)


def test_crafted_files_form_two_groups(crafted):
    table = roles.hash_files(crafted, progress=False)
    groups = roles.hash_groups(list(table["sha256"]), list(table["ahash"]))
    assert groups[0] == groups[1] == groups[2] != groups[3]
    assert groups[0] == "g" + min(table["sha256"][:3])[:16]


def test_hash_groups_are_transitive_and_content_named():
    # 0-1 share a SHA-256, 1-2 an average hash, so 0-1-2 is one group; 3 and 4 are alone.
    sha = ["c" * 64, "c" * 64, "a" * 64, "b" * 64, "d" * 64]
    ahash = ["1", "2", "2", "3", "4"]
    assert roles.hash_groups(sha, ahash) == ["g" + "a" * 16] * 3 + ["g" + "b" * 16, "g" + "d" * 16]
    # Order does not change the ids.
    order = [4, 2, 0, 3, 1]
    shuffled = roles.hash_groups([sha[i] for i in order], [ahash[i] for i in order])
    assert shuffled == [roles.hash_groups(sha, ahash)[i] for i in order]


def _image_table(sources: dict[str, int], pairs: int = 0, segmented: int = 0) -> pd.DataFrame:
    """Singleton images per source; ``pairs`` extra same-ahash partners in the first source;
    the first ``segmented`` images of ``polyps`` carry a mask."""
    rows = []
    for source, count in sources.items():
        for i in range(count):
            rows.append({"path": f"{source}/{i:04d}.jpg", "source": source,
                         "sha256": hashlib.sha256(f"{source}{i}".encode()).hexdigest(),
                         "ahash": f"{source}-{i}", "mask_path": ""})
    first = next(iter(sources))
    for i in range(pairs):
        rows.append({"path": f"{first}/pair{i:04d}.jpg", "source": first,
                     "sha256": hashlib.sha256(f"pair{i}".encode()).hexdigest(),
                     "ahash": f"{first}-{i}", "mask_path": ""})
    table = pd.DataFrame(rows)
    polyp_rows = table.index[table["source"] == "polyps"][:segmented]
    table.loc[polyp_rows, "mask_path"] = [f"masks/{i}.jpg" for i in range(len(polyp_rows))]
    return table


def test_split_is_stratified_by_source():
    table = roles.assign_roles(_image_table({"cecum": 200, "dyed-lifted-polyps": 100}), seed=7, fractions=SPLIT)
    counts = pd.crosstab(table["source"], table["role"])
    assert counts.loc["cecum"].to_dict() == {"train": 140, "val": 30, "test": 30}
    assert counts.loc["dyed-lifted-polyps"].to_dict() == {"train": 70, "val": 15, "test": 15}


def test_split_is_deterministic_and_seed_dependent():
    table = _image_table({"cecum": 60, "bbps-2-3": 40}, pairs=10)
    first = roles.assign_roles(table, seed=3, fractions=SPLIT)
    assert first["role"].tolist() == roles.assign_roles(table, seed=3, fractions=SPLIT)["role"].tolist()
    assert first["role"].tolist() != roles.assign_roles(table, seed=4, fractions=SPLIT)["role"].tolist()


def test_segmented_groups_are_audit_and_groups_stay_whole():
    table = _image_table({"cecum": 40, "polyps": 12}, pairs=15, segmented=5)
    # A labelled polyp whose average hash equals a segmented one joins the audit pool.
    table.loc[len(table)] = {"path": "polyps/near.jpg", "source": "polyps",
                             "sha256": "f" * 64, "ahash": "polyps-0", "mask_path": ""}
    result = roles.assign_roles(table, seed=11, fractions=SPLIT)
    assert (result.groupby("group_id")["role"].nunique() == 1).all()
    audit = result[result["role"] == "spatial_audit"]
    assert set(audit["path"]) == {f"polyps/{i:04d}.jpg" for i in range(5)} | {"polyps/near.jpg"}
    assert result.loc[result["mask_path"] != "", "role"].eq("spatial_audit").all()
    assert result["group_id"].nunique() == len(result) - 15 - 1


def test_check_roles_rejects_crossing_groups_and_leaked_masks():
    table = pd.DataFrame({"path": ["a", "b", "c"], "group_id": ["g1", "g1", "g2"],
                          "role": ["train", "test", "val"], "mask_path": ["", "", ""]})
    with pytest.raises(roles.RoleIntegrityError, match="cross study roles.*a \\(train\\)"):
        roles.check_roles(table)
    table["role"] = ["train", "train", "val"]
    table.loc[2, "mask_path"] = "m.jpg"
    with pytest.raises(roles.RoleIntegrityError, match="outside spatial_audit"):
        roles.check_roles(table)


def _manifest(table: pd.DataFrame) -> pd.DataFrame:
    table = table.assign(sample_id=table["path"].str.replace("/", "_"), group="g",
                         target=(table["source"] == "polyps").astype(int), width=8, height=8)
    return roles.build_manifest(roles.assign_roles(table, seed=1, fractions=SPLIT))


def test_manifest_bytes_digest_and_order(tmp_path):
    manifest = _manifest(_image_table({"polyps": 6, "cecum": 10}, segmented=2))
    digest = roles.write_manifest(manifest, tmp_path)
    data = (tmp_path / "manifest.csv").read_bytes()
    assert digest == hashlib.sha256(data).hexdigest() == roles.read_digest(tmp_path / "manifest.sha256")
    assert b"\r" not in data and data.endswith(b"\n")
    assert data.split(b"\n")[0].decode() == ",".join(roles.MANIFEST_COLUMNS)
    back = roles.read_manifest(tmp_path / "manifest.csv")
    assert back["path"].tolist() == sorted(back["path"])
    assert back["mask_path"].tolist().count("") == 14 and back["target"].dtype.kind == "i"


def test_reference_missing_mismatch_adopt_and_match(tmp_path):
    run, reference = tmp_path / "run", tmp_path / "reference"
    run.mkdir()
    manifest = _manifest(_image_table({"polyps": 6, "cecum": 20}, segmented=2))
    with pytest.raises(roles.ManifestMismatchError, match="no reference manifest"):
        roles.record_manifest(manifest, run, reference)
    assert roles.record_manifest(manifest, run, reference, adopt=True)["status"] == "adopted"
    assert (reference / "manifest.csv").read_bytes() == (run / "manifest.csv").read_bytes()
    assert roles.record_manifest(manifest, run, reference)["status"] == "match"

    changed = manifest.copy()
    changed = changed[changed["path"] != "cecum/0000.jpg"]  # one row removed
    development = changed.index[changed["role"] == "train"][0]
    changed.loc[development, "role"] = "val"  # one role changed
    with pytest.raises(roles.ManifestMismatchError) as error:
        roles.record_manifest(changed, run, reference)
    message = str(error.value)
    assert "25 rows now vs 26" in message and "1 removed (e.g. cecum/0000.jpg)" in message
    assert "role changed for 1 rows (train -> val: 1)" in message and "adopt_manifest" in message
    assert (reference / "manifest.csv").read_bytes() != roles.manifest_bytes(changed)
    assert roles.record_manifest(changed, run, reference, adopt=True)["status"] == "adopted"
    assert (reference / "manifest.csv").read_bytes() == roles.manifest_bytes(changed)
    assert roles.record_manifest(changed, run, reference)["status"] == "match"


def test_a_manifest_stage_00_rejects_is_never_left_with_a_valid_digest(tmp_path, crafted):
    """record_manifest compares before it writes: a manifest that differs from the reference
    (without adopt) leaves the run folder with no manifest.csv/manifest.sha256 -- not the
    refused one, not an earlier one -- so verify_manifest (every later stage) stops; its rows
    are in manifest.rejected.csv for reading. Adopted or matching, it is written as before."""
    data_root = crafted[0].parent
    table = roles.hash_files(crafted, progress=False).assign(
        path=[p.name for p in crafted], sample_id=[p.stem for p in crafted], group="g",
        source="cecum", target=0, mask_path="")
    accepted = roles.build_manifest(roles.assign_roles(table, seed=1, fractions=SPLIT))
    refused = accepted[accepted["path"] != "b.png"].reset_index(drop=True)  # describes real files too
    run_dir, reference = tmp_path / "run", tmp_path / "reference"
    manifest_dir = run_dir / "manifest"
    assert roles.record_manifest(accepted, manifest_dir, reference, adopt=True)["status"] == "adopted"
    assert roles.record_manifest(accepted, manifest_dir, reference)["status"] == "match"
    assert len(roles.verify_manifest(run_dir, data_root, progress=False)) == 4
    reference_bytes = (reference / roles.MANIFEST_FILE).read_bytes()

    with pytest.raises(roles.ManifestMismatchError, match="manifest.rejected.csv differs.*1 removed"):
        roles.record_manifest(refused, manifest_dir, reference)
    assert not (manifest_dir / roles.DIGEST_FILE).exists()
    assert not (manifest_dir / roles.MANIFEST_FILE).exists()
    assert (manifest_dir / roles.REJECTED_FILE).read_bytes() == roles.manifest_bytes(refused)
    assert (reference / roles.MANIFEST_FILE).read_bytes() == reference_bytes
    with pytest.raises(roles.ManifestVerificationError, match="run 00_roles first"):
        roles.verify_manifest(run_dir, data_root, progress=False)

    comparison = roles.record_manifest(refused, manifest_dir, reference, adopt=True)
    assert comparison["status"] == "adopted" and not (manifest_dir / roles.REJECTED_FILE).exists()
    assert comparison["digest"] == roles.read_digest(manifest_dir / roles.DIGEST_FILE)
    assert (reference / roles.MANIFEST_FILE).read_bytes() == roles.manifest_bytes(refused)
    assert len(roles.verify_manifest(run_dir, data_root, progress=False)) == 3


def test_verify_manifest_detects_changed_files_and_edited_manifest(tmp_path, crafted):
    data_root = crafted[0].parent
    table = roles.hash_files(crafted, progress=False).assign(
        path=[p.name for p in crafted], sample_id=[p.stem for p in crafted], group="g",
        source="cecum", target=0, mask_path="")
    run_dir = tmp_path / "run"
    roles.write_manifest(roles.build_manifest(roles.assign_roles(table, seed=1, fractions=SPLIT)),
                         run_dir / "manifest")
    assert len(roles.verify_manifest(run_dir, data_root, progress=False)) == 4

    Image.fromarray(_frame(9)).save(data_root / "b.png")
    with pytest.raises(roles.ManifestVerificationError, match="1 with different bytes.*b.png"):
        roles.verify_manifest(run_dir, data_root, progress=False)
    (data_root / "b.png").unlink()
    with pytest.raises(roles.ManifestVerificationError, match="1 missing.*b.png"):
        roles.verify_manifest(run_dir, data_root, progress=False)
    csv = run_dir / "manifest" / "manifest.csv"
    csv.write_bytes(csv.read_bytes().replace(b"cecum", b"ileum"))
    with pytest.raises(roles.ManifestVerificationError, match="changed after it was written"):
        roles.verify_manifest(run_dir, data_root, progress=False)


def test_table2_counts_by_role_and_kind():
    manifest = pd.DataFrame({
        "role": ["train", "train", "train", "val", "test", "spatial_audit", "spatial_audit"],
        "source": ["cecum", "dyed-lifted-polyps", "polyps", "bbps-2-3", "dyed-resection-margins",
                   "polyps", "polyps"],
        "target": [0, 1, 1, 0, 0, 1, 1],
        "mask_path": ["", "", "", "", "", "masks/a.jpg", ""]})   # the last: a copy without a mask
    table = roles.table2(manifest).set_index("role")
    assert table.loc["train"].tolist() == [1, 1, 1, 3, 0]
    assert table.loc["val"].tolist() == [1, 0, 0, 1, 0]
    assert table.loc["test"].tolist() == [1, 0, 0, 1, 0]
    assert table.loc["spatial_audit"].tolist() == [0, 0, 2, 2, 1]
    assert table.loc["total"].tolist() == [3, 1, 3, 7, 1]
    assert table.columns[-1] == roles.AUDITED_COLUMN


@pytest.mark.slow
def test_roles_notebook_reproduces_the_committed_smoke_manifest(tmp_path):
    """Execute 00_roles with the smoke profile: the fresh synthetic cohort must reproduce the
    committed reference digest byte for byte, and Table 2 must add up to the manifest."""
    import papermill

    from endoexplain_core import config

    repo = config.REPO_ROOT
    parameters = config.stage_parameters(config.load_profile("smoke"), "00_roles")
    parameters.update(profile="smoke", run_dir=str(tmp_path / "run"),
                      figures_dir=str(tmp_path / "figures"), data_root="",
                      manifest_reference_dir=str(repo / "data_manifest" / "smoke"))
    papermill.execute_notebook(str(repo / "notebooks" / "00_roles.ipynb"),
                               str(tmp_path / "00_roles.ipynb"), parameters=parameters,
                               kernel_name="endoexplain", cwd=str(repo / "notebooks"),
                               progress_bar=False)
    digest = (tmp_path / "run" / "manifest" / "manifest.sha256").read_text()
    assert digest == (repo / "data_manifest" / "smoke" / "manifest.sha256").read_text()
    manifest = roles.verify_manifest(tmp_path / "run", "", progress=False)
    table = pd.read_csv(tmp_path / "figures" / "table2_roles.csv").set_index("role")
    assert table.loc["total", "total"] == len(manifest)
    assert table.loc["spatial_audit", "standard polyp"] == (
        parameters["n_segmented"] + parameters["n_audit_near_duplicates"])
    # the audited column is the masked pool Table 4 panel B reads: the copies have no mask
    assert table.loc["spatial_audit", roles.AUDITED_COLUMN] == parameters["n_segmented"]
    assert (tmp_path / "figures" / "contact_sheet.png").is_file()
