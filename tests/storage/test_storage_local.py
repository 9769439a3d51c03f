"""runexp.runtime.storage on local paths: the same interface the gs:// tests exercise."""

import os
import subprocess
import sys
import threading

import pytest

from runexp.runtime import storage


def test_round_trip_creates_parents_and_overwrites(tmp_path):
    uri = str(tmp_path / "a" / "b" / "c.bin")
    storage.write_bytes(uri, b"\x00\xff" * 10)
    assert storage.read_bytes(uri) == b"\x00\xff" * 10
    storage.write_text(uri, "héllo")
    assert storage.read_text(uri) == "héllo"
    assert storage.size(uri) == len("héllo".encode())
    assert storage.exists(uri) and storage.exists(str(tmp_path / "a"))
    assert not storage.exists(str(tmp_path / "nope"))
    assert oct(os.stat(uri).st_mode & 0o777) != oct(0o600)  # not mkstemp's private mode


def test_list_is_recursive_sorted_and_scoped_to_the_directory(tmp_path):
    root = str(tmp_path / "exp")
    for rel in ["b.txt", "a/2.txt", "a/1.txt", "a/deep/x.json"]:
        storage.write_text(storage.join(root, rel), rel)
    storage.write_text(str(tmp_path / "exp2" / "other.txt"), "not under exp/")
    assert storage.list(root) == [f"{root}/a/1.txt", f"{root}/a/2.txt",
                                  f"{root}/a/deep/x.json", f"{root}/b.txt"]
    assert storage.list(root + "/") == storage.list(root)
    assert storage.list(str(tmp_path / "missing")) == []


def test_glob(tmp_path):
    root = str(tmp_path)
    for rel in ["d/train.tfrecord-00000-of-00002", "d/train.tfrecord-00001-of-00002",
                "d/eval.tfrecord-00000-of-00001", "d/info.json", "d/sub/x.json"]:
        storage.write_text(storage.join(root, rel), "x")
    assert storage.glob(f"{root}/d/train.tfrecord-*") == [
        f"{root}/d/train.tfrecord-00000-of-00002", f"{root}/d/train.tfrecord-00001-of-00002"]
    # compiler/globs.py: * stays within one directory, ** spans them.
    assert storage.glob(f"{root}/d/*.json") == [f"{root}/d/info.json"]
    assert storage.glob(f"{root}/d/**/*.json") == [f"{root}/d/info.json", f"{root}/d/sub/x.json"]
    assert storage.glob(f"{root}/d/info.json") == [f"{root}/d/info.json"]
    assert storage.glob(f"{root}/nothing/*") == []


def test_delete_and_delete_prefix(tmp_path):
    root = str(tmp_path / "ckpt")
    for rel in ["1/a", "1/b", "2/a"]:
        storage.write_text(storage.join(root, rel), rel)
    storage.delete(f"{root}/2/a")
    assert not storage.exists(f"{root}/2/a")
    with pytest.raises(FileNotFoundError):
        storage.delete(f"{root}/2/a")
    storage.delete(f"{root}/2/a", missing_ok=True)
    assert storage.delete_prefix(f"{root}/1") == 2
    assert storage.list(root) == []
    assert storage.delete_prefix(f"{root}/1") == 0


def test_write_is_atomic_for_concurrent_readers(tmp_path):
    uri = str(tmp_path / "latest")
    old, new = b"o" * (4 << 20), b"n" * (4 << 20)
    storage.write_bytes(uri, old)
    reads, torn, stop = [0], [], threading.Event()

    def reader():
        while not stop.is_set():
            data = storage.read_bytes(uri)
            reads[0] += 1
            if data != old and data != new:
                torn.append(len(data))

    t = threading.Thread(target=reader)
    t.start()
    for i in range(20):
        storage.write_bytes(uri, new if i % 2 == 0 else old)
    stop.set()
    t.join()
    assert reads[0] > 0 and not torn, f"readers saw torn files of sizes {torn}"


def test_failed_write_leaves_old_content_and_no_temp_files(tmp_path, monkeypatch):
    uri = str(tmp_path / "MANIFEST.json")
    storage.write_text(uri, "old")

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError):
        storage.write_text(uri, "new")
    monkeypatch.undo()
    assert storage.read_text(uri) == "old"
    assert os.listdir(tmp_path) == ["MANIFEST.json"]


def test_upload_and_download_dir_copy_and_verify(tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "ckpt.index").write_bytes(b"index")
    (src / "sub" / "data-00000-of-00001").write_bytes(os.urandom(100_000))
    out = storage.upload_dir(str(src), str(tmp_path / "dst"))
    assert out == [str(tmp_path / "dst" / "ckpt.index"),
                   str(tmp_path / "dst" / "sub" / "data-00000-of-00001")]
    back = storage.download_dir(str(tmp_path / "dst"), str(tmp_path / "back"))
    assert len(back) == 2
    for rel in ["ckpt.index", "sub/data-00000-of-00001"]:
        assert (tmp_path / "back" / rel).read_bytes() == (src / rel).read_bytes()


def test_upload_dir_refuses_symlinks_leading_out(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("do not ship")
    src = tmp_path / "src"
    src.mkdir()
    (src / "link").symlink_to(secret)
    with pytest.raises(storage.StorageError, match="outside"):
        storage.upload_dir(str(src), str(tmp_path / "dst"))


def test_preflight_local(tmp_path):
    assert storage.preflight(str(tmp_path / "new" / "root"))[0].startswith("ok:")
    if os.geteuid() == 0:
        return  # root can write anywhere; the read-only case cannot be shown
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    findings = storage.preflight(str(ro / "out"))
    assert findings[0].startswith("error:"), findings


def test_import_does_not_pull_in_google_cloud_or_tensorflow():
    code = ("import sys, runexp.runtime.storage; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('google', 'requests', 'urllib3', 'tensorflow', 'fsspec')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"
