"""runexp.runtime.storage against a real GCS JSON API server on loopback (gcs_emulator)."""

import os

import pytest

from runexp.runtime import storage


def test_client_uses_the_emulator_anonymously(gcs_emulator):
    from google.auth.credentials import AnonymousCredentials

    client = storage._client()
    assert isinstance(client._credentials, AnonymousCredentials)
    assert client._connection.API_BASE_URL == gcs_emulator[0]


def test_round_trip(gcs_prefix):
    uri = storage.join(gcs_prefix, "dir/blob.bin")
    payload = bytes(range(256)) * 64
    storage.write_bytes(uri, payload)
    assert storage.read_bytes(uri) == payload
    assert storage.size(uri) == len(payload)
    storage.write_text(uri, "héllo")  # overwrite
    assert storage.read_text(uri) == "héllo"
    storage.write_bytes(storage.join(gcs_prefix, "empty"), b"")
    assert storage.read_bytes(storage.join(gcs_prefix, "empty")) == b""


def test_large_object_takes_the_resumable_path(gcs_prefix, tmp_path):
    # Over 8 MiB, google-cloud-storage switches from one multipart request to a resumable
    # session (initiate, then PUT the data): both must round-trip and verify.
    src = tmp_path / "src"
    src.mkdir()
    (src / "big").write_bytes(os.urandom(9 << 20))
    storage.upload_dir(str(src), storage.join(gcs_prefix, "ckpt"))
    storage.download_dir(storage.join(gcs_prefix, "ckpt"), str(tmp_path / "back"))
    assert (tmp_path / "back" / "big").read_bytes() == (src / "big").read_bytes()


def test_missing_object(gcs_prefix):
    uri = storage.join(gcs_prefix, "nope")
    with pytest.raises(FileNotFoundError, match=uri):
        storage.read_bytes(uri)
    with pytest.raises(FileNotFoundError, match=uri):
        storage.size(uri)
    with pytest.raises(FileNotFoundError):
        storage.delete(uri)
    storage.delete(uri, missing_ok=True)


def test_exists_for_objects_and_prefixes(gcs_prefix):
    storage.write_text(storage.join(gcs_prefix, "stage/COMPLETED"), "")
    assert storage.exists(storage.join(gcs_prefix, "stage/COMPLETED"))
    assert storage.exists(storage.join(gcs_prefix, "stage"))
    assert storage.exists(storage.join(gcs_prefix, "stage/"))
    assert not storage.exists(storage.join(gcs_prefix, "sta"))
    assert not storage.exists(storage.join(gcs_prefix, "other"))


def test_list_is_recursive_sorted_and_scoped_to_the_directory(gcs_prefix):
    root = storage.join(gcs_prefix, "exp")
    for rel in ["b.txt", "a/2.txt", "a/1.txt", "a/deep/x.json"]:
        storage.write_text(storage.join(root, rel), rel)
    storage.write_text(storage.join(gcs_prefix, "exp2/other.txt"), "not under exp/")
    assert storage.list(root) == [f"{root}/a/1.txt", f"{root}/a/2.txt",
                                  f"{root}/a/deep/x.json", f"{root}/b.txt"]
    assert storage.list(root + "/") == storage.list(root)
    assert storage.list(storage.join(gcs_prefix, "missing")) == []


def test_glob(gcs_prefix):
    root = gcs_prefix
    for rel in ["d/train.tfrecord-00000-of-00002", "d/train.tfrecord-00001-of-00002",
                "d/eval.tfrecord-00000-of-00001", "d/info.json", "d/sub/x.json"]:
        storage.write_text(storage.join(root, rel), "x")
    assert storage.glob(f"{root}/d/train.tfrecord-*") == [
        f"{root}/d/train.tfrecord-00000-of-00002", f"{root}/d/train.tfrecord-00001-of-00002"]
    assert storage.glob(f"{root}/d/*.tfrecord-0000?-of-00001") == [
        f"{root}/d/eval.tfrecord-00000-of-00001"]
    # compiler/globs.py: * stays within one directory, ** spans them.
    assert storage.glob(f"{root}/d/*.json") == [f"{root}/d/info.json"]
    assert storage.glob(f"{root}/d/**/*.json") == [f"{root}/d/info.json", f"{root}/d/sub/x.json"]
    assert storage.glob(f"{root}/d/info.json") == [f"{root}/d/info.json"]
    assert storage.glob(f"{root}/nothing/*") == []
    with pytest.raises(ValueError, match="bucket"):
        storage.glob("gs://runexp-*/x")


def test_delete_and_delete_prefix(gcs_prefix):
    root = storage.join(gcs_prefix, "ckpt")
    for rel in ["1/a", "1/b", "2/a", "10/a"]:
        storage.write_text(storage.join(root, rel), rel)
    storage.delete(f"{root}/2/a")
    assert not storage.exists(f"{root}/2/a")
    assert storage.delete_prefix(f"{root}/1") == 2  # not 10/
    assert storage.list(root) == [f"{root}/10/a"]
    with pytest.raises(ValueError, match="whole bucket"):
        storage.delete_prefix("gs://runexp-test/")


def test_upload_and_download_dir_verify(gcs_prefix, tmp_path):
    src = tmp_path / "src"
    (src / "variables").mkdir(parents=True)
    files = {"checkpoint": b'model_checkpoint_path: "ckpt-3"\n',
             "ckpt-3.index": os.urandom(1000),
             "variables/ckpt-3.data-00000-of-00001": os.urandom(300_000),
             "empty": b""}
    for rel, data in files.items():
        (src / rel).write_bytes(data)
    dest = storage.join(gcs_prefix, "ckpt-3")
    uploaded = storage.upload_dir(str(src), dest)
    assert uploaded == sorted(storage.join(dest, rel) for rel in files)
    assert storage.list(dest) == uploaded
    back = storage.download_dir(dest, str(tmp_path / "back"))
    assert back == sorted(str(tmp_path / "back" / rel) for rel in files)
    for rel, data in files.items():
        assert (tmp_path / "back" / rel).read_bytes() == data
    assert not [n for n in os.listdir(tmp_path / "back") if n.startswith(".tmp")]


def test_preflight_existing_bucket(gcs_prefix):
    findings = storage.preflight(gcs_prefix)
    assert [f.split(":")[0] for f in findings] == ["ok", "ok", "ok"], findings
    assert "exists" in findings[0] and "create and delete" in findings[1]
    assert storage.list(gcs_prefix) == []  # the probe object is gone


def test_preflight_compares_the_bucket_location_with_the_compute_region(gcs_prefix):
    # The emulator's buckets are in the US multi-region.
    near = storage.preflight(gcs_prefix, region="us-central1")
    assert any(f.startswith("ok:") and "serves region us-central1" in f for f in near), near
    far = storage.preflight(gcs_prefix, region="europe-west4")
    assert any(f.startswith("WARNING:") and "europe-west4" in f for f in far), far


def test_preflight_missing_bucket(gcs_emulator):
    findings = storage.preflight("gs://no-such-bucket-runexp/exp")
    assert len(findings) == 1 and findings[0].startswith("error:")
    assert "gs://no-such-bucket-runexp" in findings[0] and "does not exist" in findings[0]


def test_preflight_warns_on_public_bucket(gcs_emulator):
    client = storage._client()
    bucket = client.create_bucket("runexp-public-test")
    policy = bucket.get_iam_policy()
    policy.bindings.append({"role": "roles/storage.objectViewer", "members": {"allUsers"}})
    bucket.set_iam_policy(policy)
    findings = storage.preflight("gs://runexp-public-test/exp")
    warnings = [f for f in findings if f.startswith("WARNING:")]
    assert len(warnings) == 1 and "allUsers" in warnings[0]
    assert "roles/storage.objectViewer" in warnings[0]


def test_preflight_notes_enforced_public_access_prevention(gcs_emulator):
    bucket = storage._client().create_bucket("runexp-pap-test")
    bucket.iam_configuration.public_access_prevention = "enforced"
    bucket.patch()
    findings = storage.preflight("gs://runexp-pap-test/exp")
    assert "ok: public access prevention is enforced on gs://runexp-pap-test" in findings


def test_preflight_offline_returns_a_note(monkeypatch, fast_retries):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}")
    findings = storage.preflight("gs://any-bucket/exp")
    assert len(findings) == 1 and findings[0].startswith("skipped:"), findings
