"""CRC-32C (Castagnoli), masked as TFRecord framing masks it: the one implementation for the
records runexp writes (tasks/cache/records.py) and the ones the dry run peeks into
(compiler/formats/example_peek.py). google-crc32c's C extension when installed (it comes with
google-cloud-storage), a table in pure Python otherwise. Standard library only.
"""

from __future__ import annotations


def _crc32c_function():
    try:
        import google_crc32c  # C extension, installed with google-cloud-storage; no TensorFlow
        if google_crc32c.implementation == "c":
            return google_crc32c.value
    except ImportError:
        pass
    table = []
    for i in range(256):
        crc = i
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)

    def crc32c(data: bytes) -> int:
        crc = 0xFFFFFFFF
        for b in data:
            crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
        return crc ^ 0xFFFFFFFF
    return crc32c


_crc32c = None


def masked_crc(data: bytes) -> int:
    global _crc32c
    if _crc32c is None:
        _crc32c = _crc32c_function()
    crc = _crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
