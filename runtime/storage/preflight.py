"""Cheap checks of a storage destination before a run writes there (``preflight``): the
bucket exists and suits the compute region, objects can be created and deleted, nothing makes
it public, a TPU's service account may use it. Never raises for an unreachable destination."""

from __future__ import annotations

import dataclasses
import os
import uuid

from runexp.runtime.storage.gcs_client import client
from runexp.runtime.storage.paths import as_str, is_gcs, join, split_gcs
from runexp.runtime.storage.retry import error_label, retry_policy, with_retries


def preflight(uri_prefix: str, region: str | None = None,
              service_account: str | None = None) -> list[str]:
    """Cheap checks before a run writes under ``uri_prefix``; returns findings, never raises
    for an unreachable or missing destination. Each finding starts with ``ok:``,
    ``WARNING:``, ``error:`` or ``skipped:``.

    On GCS: the bucket exists; an object can be created and deleted under the prefix; the
    bucket's location suits ``region`` (the compute region, e.g. a TPU zone's, when given);
    no IAM binding makes the bucket public, and ``service_account`` (a TPU's) is granted
    object read and write on the bucket (when the policy is readable)."""
    uri_prefix = as_str(uri_prefix)
    if not is_gcs(uri_prefix):
        return _preflight_local(uri_prefix)
    base = retry_policy()
    quick = dataclasses.replace(base, max_tries=min(base.max_tries, 2),
                                timeout=min(base.timeout, 10.0), deadline=20.0)
    findings, reachable = _bucket_findings(uri_prefix, region, quick)
    if not reachable:
        return findings
    findings.append(_probe_finding(uri_prefix, quick))
    findings.extend(_iam_findings(split_gcs(uri_prefix)[0], service_account, quick))
    return findings


def _bucket_findings(uri_prefix: str, region: str | None, quick) -> tuple[list[str], bool]:
    """The bucket's own checks, and whether the other checks are worth running (False when
    there are no credentials, no bucket or no network: one finding says which)."""
    from google.api_core import exceptions as api
    from google.auth import exceptions as auth_exceptions

    bucket_name = split_gcs(uri_prefix)[0]
    bucket_uri = f"gs://{bucket_name}"
    try:
        bucket = client().bucket(bucket_name)
        with_retries("preflight", bucket_uri,
                     lambda: bucket.reload(timeout=quick.timeout, retry=None), quick)
    except auth_exceptions.DefaultCredentialsError:
        return [f"error: no Google credentials to reach {uri_prefix}: run `gcloud auth "
                "application-default login` (or set GOOGLE_APPLICATION_CREDENTIALS to a "
                "service account key file); to review a plan without storage access, add "
                "--offline to the dry run"], False
    except api.NotFound:
        return [f"error: bucket {bucket_uri} does not exist (or is not visible to these "
                "credentials)"], False
    except api.Forbidden:
        return [f"WARNING: cannot read the metadata of bucket {bucket_uri} (403); "
                "continuing with the write probe"], True
    except Exception as exc:  # noqa: BLE001 - offline, DNS, budget: a note, not a crash
        return [f"skipped: cannot reach storage for {bucket_uri} ({error_label(exc)}); "
                "checks not run"], False
    findings = [f"ok: bucket {bucket_uri} exists (location {bucket.location}, "
                f"storage class {bucket.storage_class})"]
    if region:
        findings.append(_location_finding(bucket_uri, bucket.location or "", region))
    if bucket.iam_configuration.public_access_prevention == "enforced":
        findings.append(f"ok: public access prevention is enforced on {bucket_uri}")
    return findings, True


def _probe_finding(uri_prefix: str, quick) -> str:
    """Whether an object can be created and deleted under the prefix."""
    bucket_name = split_gcs(uri_prefix)[0]
    probe = join(uri_prefix, f".runexp-preflight-{uuid.uuid4().hex[:12]}")
    try:
        blob = client().bucket(bucket_name).blob(split_gcs(probe)[1])
        with_retries("preflight", probe, lambda: blob.upload_from_string(
            b"", timeout=quick.timeout, retry=None), quick)
        with_retries("preflight", probe, lambda: blob.delete(
            timeout=quick.timeout, retry=None), quick)
        return f"ok: can create and delete objects under {uri_prefix}"
    except Exception as exc:  # noqa: BLE001
        return (f"error: cannot create and delete a probe object under {uri_prefix} "
                f"({error_label(exc)})")


def _iam_findings(bucket_name: str, service_account: str | None, quick) -> list[str]:
    """No public bindings, and the TPU's service account may read and write."""
    bucket_uri = f"gs://{bucket_name}"
    try:
        policy = with_retries("preflight", bucket_uri, lambda: client().bucket(
            bucket_name).get_iam_policy(requested_policy_version=3,
                                        timeout=quick.timeout, retry=None), quick)
    except Exception as exc:  # noqa: BLE001
        return [f"skipped: IAM policy of {bucket_uri} not readable "
                f"({error_label(exc)}); public access not checked"]
    public = [f"{binding['role']} to {member}" for binding in policy.bindings
              for member in sorted(set(binding.get("members", ())) &
                                   {"allUsers", "allAuthenticatedUsers"})]
    if public:
        findings = [f"WARNING: bucket {bucket_uri} is public: grants " + "; ".join(public)
                    + ". runexp never makes anything public; remove these bindings unless "
                    "you mean them"]
    else:
        findings = [f"ok: no allUsers/allAuthenticatedUsers bindings on {bucket_uri}"]
    if service_account:
        findings.append(_service_account_finding(policy.bindings, service_account, bucket_uri))
    return findings


# Bucket roles that let a member read objects, and create/overwrite them.
_READ_ROLES = {"roles/storage.admin", "roles/storage.objectAdmin", "roles/storage.objectUser",
               "roles/storage.objectViewer", "roles/storage.legacyObjectReader",
               "roles/storage.legacyBucketOwner"}
_WRITE_ROLES = {"roles/storage.admin", "roles/storage.objectAdmin", "roles/storage.objectUser",
                "roles/storage.objectCreator", "roles/storage.legacyBucketWriter",
                "roles/storage.legacyBucketOwner"}


def _service_account_finding(bindings, service_account: str, bucket_uri: str) -> str:
    """Whether the bucket's own policy lets the TPU's service account read and write."""
    member = f"serviceAccount:{service_account}"
    roles = {b["role"] for b in bindings if member in set(b.get("members", ()))}
    missing = [what for what, allowed in (("read", _READ_ROLES), ("write", _WRITE_ROLES))
               if not roles & allowed]
    if not missing:
        return f"ok: the TPU service account {service_account} can read and write {bucket_uri}"
    return (f"WARNING: the bucket policy of {bucket_uri} does not let the TPU service account "
            f"{service_account} {' or '.join(missing)} objects (it may still through project-"
            "level roles); grant it roles/storage.objectAdmin on the bucket, or the TPU will "
            "fail to read data or write checkpoints")


_MULTI_REGIONS = {"US": "us-", "EU": "europe-", "ASIA": "asia-"}


def _location_finding(bucket_uri: str, location: str, region: str) -> str:
    loc, region = location.upper(), region.lower()
    if loc.lower() == region or region.startswith(_MULTI_REGIONS.get(loc, "\0")):
        return f"ok: bucket {bucket_uri} ({location}) serves region {region}"
    return (f"WARNING: bucket {bucket_uri} is in {location} but compute runs in {region}: "
            "cross-region reads add latency and egress charges")


def _preflight_local(path: str) -> list[str]:
    probe = os.path.join(path, f".runexp-preflight-{uuid.uuid4().hex[:12]}")
    try:
        os.makedirs(path, exist_ok=True)
        with open(probe, "wb"):
            pass
        os.remove(probe)
    except OSError as exc:
        return [f"error: cannot write under {path} ({exc.strerror or type(exc).__name__})"]
    return [f"ok: can create and delete files under {path}"]
