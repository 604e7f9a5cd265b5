"""S3 backend (`s3://bucket[/prefix]`) through the official `minio` SDK.

Integrity: the sha256 of an object travels as user metadata (`x-amz-meta-sha256`) in the
request that creates it. S3 makes a PUT and a multipart completion atomic, so an object and
its digest appear together or not at all. Every GET recomputes the digest of the bytes it
received and compares it with the header of the same response. (rclone serve s3, the test
server, can pair one version's headers with another version's body while a key is being
overwritten concurrently: `get_bytes` and `get_file` then read again (`_reread`); `iter_chunks`,
or a read whose re-reads race too, fails with Unavailable or ArtifactCorrupted. None returns
mixed bytes.)

How uploads get the digest into the headers, and why (measured against `rclone serve s3` on
this project's 2-core machine, 256 MiB object, medians of interleaved runs; see
bench/RESULTS.md for the current table):

- Hash first, then upload: the digest must be in the headers before the first byte goes out.
  One sha256 pass costs ~0.15 s per 256 MiB here; a raw SDK `put_object` takes ~1.1 s.
- Upload to a temp key, then a server-side copy that sets the metadata, then delete: the
  copy took 1.27 s on its own for 256 MiB (the server re-writes every byte) -- rejected.
- Hash first + public `put_object`: the SDK hashes every part *again* to sign it over plain
  HTTP, so the store pays two hashing passes: 0.87x the raw SDK -- below the 0.9x target.
- Hash first + one PUT whose signed payload hash *is* the artifact digest
  (`minio_client.TraceMinio.put_known_payload`): one hashing pass in total, no part
  bookkeeping, and servers that verify signed payloads (AWS, MinIO) check the body against
  the digest: 1.05x the raw SDK.
  That is the path for every object up to `S3Settings.multipart_threshold`; files are
  streamed from disk by urllib3 (bounded memory). Bigger objects use multipart uploads
  (`part_size`), re-hashing the source as it is read and aborting the upload if it changed.

Why uploads cannot overlap the hash with the transfer the way downloads do: the digest is a
request header (and, signed, the payload hash), and S3 takes no metadata after the body (a
multipart upload takes it in CreateMultipartUpload, before the first part). The store hashes
once and sends; the hash costs ~0.8 ms per MiB against ~8 ms per MiB of upload here, and the
SDK's own `put_object` hashes every part for its signature too (bench/RESULTS.md).

Downloads read straight into the bytes object they return (`localio.receive_bytes`, built in
place: `buffers.BytesBuilder`) or the temp file they publish (`localio.publish_verified`), and
hash every block as it lands. Reads of `integrity.OVERLAP_MIN` (4 MiB) or more hash on shared
helper threads, 256 KiB block by block, while the next block is received, so with a core to
spare only the last block's hash remains once the body has arrived. Every read still hashes
every byte and compares before it returns anything (`get_bytes`), publishes anything
(`get_file`, temp file + rename) or yields the final chunk (`iter_chunks`). When every core is
busy, hashing costs its CPU time either way (~0.8 ms/MiB, a quarter of the CPU that client and
server together spend on a raw SDK GET here); the bench's CPU columns show it.

Errors: a missing key is NotFound, a missing bucket FailedPrecondition, refused credentials
Unauthenticated, an unreachable or failing server Unavailable (the message names the
endpoint). The SDK's urllib3 pool retries connection errors and 5xx answers `max_retries`
times with backoff. A whole read (`get_bytes`, `get_file`) whose body then fails, cut short or
not matching its recorded digest, is read again up to `max_retries` times (`_reread`): a
server that serves a filesystem can tear a GET that races an overwrite; damage repeats word for
word and is raised by the second read.
"""

from __future__ import annotations

import functools
import hashlib
import http.client
import io
import logging
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import certifi
import urllib3
from minio.error import InvalidResponseError, S3Error, ServerError
from urllib3.util import Retry, Timeout

from trace_common.errors import (
    ArtifactCorrupted,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    TraceError,
    Unauthenticated,
    Unavailable,
)

from .base import ArtifactStore, Observer, hold_back_last
from .info import ArtifactInfo
from .integrity import CHUNK, ParallelSha256, check_sha256, is_sha256_hex, new_hasher, no_digest_message
from .keys import MAX_KEY_BYTES, RootSpec
from .localio import publish_verified, receive_bytes, sha256_file, transfer_ended_early
from .minio_client import FAST_PATH, TraceMinio
from .settings import S3Settings

SHA_META = "sha256"
SHA_HEADER = "x-amz-meta-" + SHA_META
_XML_CODE = re.compile(r"<Code>([A-Za-z0-9.]+)</Code>")
_NETWORK_ERRORS = (urllib3.exceptions.HTTPError, http.client.HTTPException, ConnectionError, TimeoutError)
T = TypeVar("T")
log = logging.getLogger(__name__)


class _BadBody(Exception):
    """A GET whose headers arrived but whose body failed (`error`): cut short or not matching
    its recorded digest. Internal to `_reread`, which re-reads or raises `error`."""

    def __init__(self, error: TraceError):
        super().__init__(str(error))
        self.error = error


@functools.lru_cache(maxsize=16)
def client_for(settings: S3Settings) -> TraceMinio:
    """One SDK client (and connection pool) per distinct settings, shared by all stores."""
    http_client = urllib3.PoolManager(
        timeout=Timeout(connect=settings.connect_timeout_s, read=settings.read_timeout_s),
        maxsize=16,
        cert_reqs="CERT_REQUIRED" if settings.verify_tls else "CERT_NONE",
        ca_certs=os.environ.get("SSL_CERT_FILE") or certifi.where(),
        retries=Retry(total=settings.max_retries, backoff_factor=0.2, status_forcelist=[500, 502, 503, 504]),
        blocksize=CHUNK,  # urllib3 reads file bodies in blocks of this size (default 16 KiB)
    )
    return TraceMinio(settings.endpoint, access_key=settings.access_key or None,
                      secret_key=settings.secret_key.get_secret_value() or None, secure=settings.secure,
                      region=settings.region, http_client=http_client)


def fingerprint(st: os.stat_result) -> tuple[int, ...]:
    """What changes when a file is modified or replaced (content changes bump mtime/ctime)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class _ExactReader:
    """A file body of exactly `size` bytes for urllib3.

    Never sends more (a file that grew would corrupt the HTTP stream), fails instead of
    stalling when the file shrank, supports tell/seek so urllib3 can rewind it for a retry,
    and -- before handing over the final block -- checks that the file was not modified or
    replaced since it was hashed (`expected` fingerprint). Raising there aborts the request
    before the body is complete, so the server stores nothing. Servers that verify the signed
    payload hash (AWS, MinIO) would refuse a changed body anyway; rclone serve s3 does not,
    which is why this check does not rely on them."""

    def __init__(self, f, size: int, what: str, expected: tuple[int, ...]):
        self._f, self._size, self._what, self._expected = f, size, what, expected
        self._start = f.tell()
        self._check_unchanged()

    def _check_unchanged(self) -> None:
        if fingerprint(os.fstat(self._f.fileno())) != self._expected:
            raise FailedPrecondition(f"{self._what}: the source file changed while it was being uploaded; "
                                     "retry once it is no longer being written")

    def read(self, n: int = -1) -> bytes:
        left = self._size - (self._f.tell() - self._start)
        if left <= 0:
            return b""
        data = self._f.read(left if n is None or n < 0 else min(n, left))
        if not data:
            raise FailedPrecondition(f"{self._what}: the source file shrank during the upload; retry")
        if len(data) == left:
            self._check_unchanged()
        return data

    def tell(self) -> int:
        return self._f.tell()

    def seek(self, pos: int, whence: int = 0) -> int:
        return self._f.seek(pos, whence)


class _VerifyingReader(_ExactReader):
    """An `_ExactReader` that hashes what the SDK reads for a multipart upload and raises
    before the last part is sent if the source no longer matches the digest in the headers,
    so the SDK aborts the upload instead of completing it."""

    def __init__(self, f, size: int, what: str, expected: tuple[int, ...], digest: str):
        super().__init__(f, size, what, expected)
        self._digest, self._hasher, self._seen = digest, hashlib.sha256(), 0

    def read(self, n: int = -1) -> bytes:
        data = super().read(n)
        self._hasher.update(data)
        self._seen += len(data)
        if data and self._seen == self._size and self._hasher.hexdigest() != self._digest:
            raise FailedPrecondition(f"{self._what}: the source changed while it was uploaded; retry")
        return data


class S3Store(ArtifactStore):
    backend = "s3"

    def __init__(self, root: RootSpec, settings: S3Settings, observer: Observer | None = None):
        super().__init__(root, observer)
        self._bucket = root.location
        self._prefix = root.prefix
        self._settings = settings
        self._client = client_for(settings)

    # ----------------------------------------------------------------- names and errors

    def _name(self, key: str) -> str:
        name = f"{self._prefix}/{key}" if self._prefix else key
        if len(name.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
            raise InvalidArgument(f"with the store prefix the object name exceeds {MAX_KEY_BYTES} bytes",
                                  field="key", expected="a shorter key", got=key, fix="shorten the key")
        return name

    def _uri_for(self, key: str) -> str:
        return f"s3://{self._bucket}/{self._name(key)}"

    def _info(self, key: str, digest: str, size: int) -> ArtifactInfo:
        return ArtifactInfo(uri=self._uri_for(key), key=key, sha256=digest, size=size)

    def _unavailable(self, exc: BaseException) -> Unavailable:
        return Unavailable(f"S3 endpoint {self._settings.endpoint} is unavailable ({type(exc).__name__}: {exc}); "
                           "check that the server is running and that S3Settings.endpoint points at it")

    @contextmanager
    def _errors(self, key: str | None = None) -> Iterator[None]:
        """Translate SDK and network failures into domain errors."""
        try:
            yield
        except TraceError:
            raise
        except S3Error as exc:
            raise self._from_s3(exc.code or "", exc.message or "", key) from exc
        except InvalidResponseError as exc:
            # The SDK only parses error bodies labelled application/xml; rclone labels them
            # text/xml. Recover the S3 error code from the body when there is one.
            status = getattr(exc, "_code", None)
            found = _XML_CODE.search(getattr(exc, "_body", None) or "")
            if isinstance(status, int) and status < 500 and found:
                raise self._from_s3(found.group(1), "", key) from exc
            raise self._unavailable(exc) from exc
        except ServerError as exc:
            raise self._unavailable(exc) from exc
        except _NETWORK_ERRORS as exc:
            raise self._unavailable(exc) from exc

    def _from_s3(self, code: str, message: str, key: str | None) -> TraceError:
        where = self._uri_for(key) if key else f"s3://{self._bucket}"
        if code in ("NoSuchKey", "NoSuchObject"):
            return NotFound(f"artifact {where} does not exist")
        if code == "NoSuchBucket":
            return FailedPrecondition(f"bucket '{self._bucket}' does not exist on {self._settings.endpoint}; "
                                      "create it (e.g. `mc mb`) or fix the s3:// root URI")
        if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
            return Unauthenticated(f"S3 endpoint {self._settings.endpoint} refused the request for {where} "
                                   f"({code}); check S3Settings.access_key and secret_key")
        if code in ("XAmzContentSHA256Mismatch", "BadDigest", "IncompleteBody"):
            return FailedPrecondition(f"{where}: the server received bytes that do not match their sha256 "
                                      f"({code}); the source changed during the upload; retry")
        return FailedPrecondition(f"S3 endpoint {self._settings.endpoint} answered {code} for {where}: {message}")

    # ----------------------------------------------------------------- writes

    def _headers(self, digest: str) -> dict[str, str]:
        return {"Content-Type": "application/octet-stream", SHA_HEADER: digest}

    def _put_bytes(self, key: str, data: bytes | memoryview) -> ArtifactInfo:
        digest = hashlib.sha256(data).hexdigest()
        size = len(data)
        name = self._name(key)
        with self._errors(key):
            if FAST_PATH and size <= self._settings.multipart_threshold:
                self._client.put_known_payload(self._bucket, name, data, size, digest, self._headers(digest))
            else:
                self._client.put_object(self._bucket, name, io.BytesIO(data), size,
                                        metadata={SHA_META: digest}, part_size=self._settings.part_size,
                                        num_parallel_uploads=2)
        return self._info(key, digest, size)

    def _put_file(self, key: str, path: str) -> ArtifactInfo:
        before = fingerprint(os.stat(path))
        digest, size = sha256_file(path)
        return self._upload_file(key, path, digest, size, before)

    def _upload_file(self, key: str, path: str, digest: str, size: int, before: tuple[int, ...]) -> ArtifactInfo:
        name, what = self._name(key), self._uri_for(key)
        with open(path, "rb", buffering=0) as f, self._errors(key):
            if FAST_PATH and size <= self._settings.multipart_threshold:
                body = _ExactReader(f, size, what, before)
                self._client.put_known_payload(self._bucket, name, body, size, digest, self._headers(digest))
            else:
                body = _VerifyingReader(f, size, what, before, digest)
                self._client.put_object(self._bucket, name, body, size, metadata={SHA_META: digest},
                                        part_size=self._settings.part_size, num_parallel_uploads=2)
        return self._info(key, digest, size)

    def _put_stream(self, key: str, chunks: Iterator[bytes]) -> ArtifactInfo:
        # Short streams stay in memory (one PUT); longer ones spool to a temp file, hashed on
        # the way, so memory stays bounded by `stream_buffer` whatever the length.
        held: list[bytes] = []
        total = 0
        for chunk in chunks:
            held.append(bytes(chunk))
            total += len(chunk)
            if total > self._settings.stream_buffer:
                break
        else:
            return self._put_bytes(key, b"".join(held))
        with tempfile.NamedTemporaryFile(dir=self._settings.spool_dir, prefix=".trace-spool-") as spool:
            hasher = hashlib.sha256()
            for chunk in _chain(held, chunks):
                hasher.update(chunk)
                spool.write(chunk)
            held.clear()
            spool.flush()
            return self._upload_file(key, spool.name, hasher.hexdigest(), spool.tell(),
                                     fingerprint(os.fstat(spool.fileno())))

    # ----------------------------------------------------------------- reads

    @contextmanager
    def _get(self, key: str, *, rereadable: bool) -> Iterator[tuple[urllib3.BaseHTTPResponse, str | None, int | None]]:
        """One GET of `key`: (response, recorded sha256, Content-Length). Failures before the
        answer's headers are domain errors (the SDK's pool has retried them). When `rereadable`,
        an Unavailable or ArtifactCorrupted raised while the body is read and checked becomes
        `_BadBody`, for `_reread`."""
        with self._errors(key):
            resp = self._client.get_object(self._bucket, self._name(key))
        try:
            length = resp.headers.get("Content-Length")
            yield resp, resp.headers.get(SHA_HEADER), int(length) if length is not None else None
        except (Unavailable, ArtifactCorrupted) as exc:
            if not rereadable:
                raise
            raise _BadBody(exc) from exc
        finally:
            raw = getattr(resp, "_fp", None)
            if isinstance(raw, http.client.HTTPResponse) and raw.isclosed():
                # Body fully read through `raw` (see _readinto), which urllib3 did not see:
                # hand the connection back for reuse, as urllib3 does after its own reads.
                resp.release_conn()
            resp.close()  # closes the connection only if the body was not fully read
            resp.release_conn()

    def _reread(self, key: str, read_once: Callable[[], T]) -> T:
        """`read_once()`, read again (backing off 0.05, 0.1, 0.2 s, ...) while its body fails: cut
        short, no digest recorded, or bytes that do not match the digest the same answer recorded.
        A failure that repeats, word for word (the same recorded and received digests, the same
        byte counts), is damage and is raised at once; so is the last one after `max_retries`
        re-reads. On S3 and MinIO one GET is one atomic version, so a mismatch there repeats:
        damage costs one extra read. Servers that serve a filesystem (`rclone serve s3`, some
        gateways) are not atomic: a GET racing an overwrite of the key can pair one version's
        headers with another's bytes, or end early; a re-read settles it. Only whole reads are
        re-read: `iter_chunks` may have handed chunks out already."""
        previous = ""
        for attempt in range(self._settings.max_retries + 1):
            try:
                return read_once()
            except _BadBody as bad:
                error = bad.error
            if attempt == self._settings.max_retries or str(error) == previous:
                break
            previous = str(error)
            log.warning("%s: re-reading (%d of %d): %s", self._uri_for(key), attempt + 1,
                        self._settings.max_retries, error)
            time.sleep(0.05 * 2 ** attempt)
        raise error from error.__cause__

    def _readinto(self, resp: urllib3.BaseHTTPResponse):
        """`readinto(view) -> n` over the response body, network errors as Unavailable.

        Reads through the underlying `http.client.HTTPResponse` when there is one: its
        `readinto` fills our buffer straight from the socket, where urllib3's copies each
        block into a fresh bytes object first. Objects are stored without Content-Encoding,
        so the raw body is exactly the stored bytes."""
        raw = getattr(resp, "_fp", None)
        direct = raw.readinto if isinstance(raw, http.client.HTTPResponse) and not resp.headers.get(
            "Content-Encoding") else None

        def readinto(view: memoryview) -> int:
            try:
                if direct is not None:
                    return direct(view)
                data = resp.read(len(view))
                view[:len(data)] = data
                return len(data)
            except _NETWORK_ERRORS as exc:
                raise self._unavailable(exc) from exc

        return readinto

    def _get_bytes(self, key: str) -> bytes:
        def once() -> bytes:
            with self._get(key, rereadable=True) as (resp, recorded, length):
                data, digest = self._read_all(resp, length, self._uri_for(key))
                check_sha256(recorded, digest, self._uri_for(key))
            return data

        return self._reread(key, once)

    def _read_all(self, resp: urllib3.BaseHTTPResponse, length: int | None, what: str) -> tuple[bytes, str]:
        if length is None:  # chunked answer: collect, then join (one extra copy)
            hasher = hashlib.sha256()
            parts = []
            while chunk := resp.read(CHUNK):
                hasher.update(chunk)
                parts.append(chunk)
            return b"".join(parts), hasher.hexdigest()
        return receive_bytes(self._readinto(resp), length, transfer_ended_early(what))

    def _iter_chunks(self, key: str, chunk_size: int) -> Iterator[bytes]:
        what = self._uri_for(key)
        with self._get(key, rereadable=False) as (resp, recorded, length):
            # The chunks are immutable bytes: safe to hash beside the consumer. At most ~1 MiB of
            # them wait for the hasher, so a stream's memory stays bounded.
            hasher = new_hasher(length, max_pending=max(1, CHUNK // chunk_size))
            got = 0

            def read() -> Iterator[bytes]:
                nonlocal got
                while True:
                    try:
                        chunk = resp.read(chunk_size)
                    except _NETWORK_ERRORS as exc:
                        raise self._unavailable(exc) from exc
                    if not chunk:
                        return
                    hasher.update(chunk)
                    got += len(chunk)
                    yield chunk

            def verify() -> None:
                digest = hasher.hexdigest()
                if length is not None and got != length:
                    raise Unavailable(f"{what}: the transfer ended after {got} of {length} bytes; retry")
                check_sha256(recorded, digest, what)

            try:
                yield from hold_back_last(read(), verify)
            finally:
                if isinstance(hasher, ParallelSha256):
                    hasher.close()  # abandoned or failed stream: hand the helper thread back

    def _get_file(self, key: str, dest: str, durable: bool) -> ArtifactInfo:
        def once() -> ArtifactInfo:
            with self._get(key, rereadable=True) as (resp, recorded, length):
                return publish_verified(dest, durable, self._uri_for(key), recorded, self._readinto(resp),
                                        lambda digest, size: self._info(key, digest, size), expected_size=length,
                                        size_hint=length)

        return self._reread(key, once)

    # ----------------------------------------------------------------- metadata

    def _head(self, key: str) -> tuple[str | None, int]:
        """(recorded sha256 or None, size) of `key`, from a HEAD request."""
        with self._errors(key):
            obj = self._client.stat_object(self._bucket, self._name(key))
        return obj.metadata.get(SHA_HEADER) if obj.metadata is not None else None, obj.size or 0

    def _stat(self, key: str) -> ArtifactInfo:
        recorded, size = self._head(key)
        if not is_sha256_hex(recorded):
            check_sha256(recorded, "", self._uri_for(key))
        return self._info(key, recorded, size)

    def _exists(self, key: str) -> bool:
        try:
            self._stat(key)
        except NotFound:
            return False
        except ArtifactCorrupted:
            return True  # it exists; reading it will report the damage
        return True

    def _list(self, prefix: str) -> Iterable[ArtifactInfo]:
        root = f"{self._prefix}/" if self._prefix else ""
        found: list[ArtifactInfo] = []
        with self._errors():
            names = [obj.object_name for obj in self._client.list_objects(self._bucket, prefix=root + prefix,
                                                                         recursive=True)]
        for name in names:
            if not name or name.endswith("/"):
                continue
            key = name[len(root):]
            try:
                recorded, size = self._head(key)
            except NotFound:
                continue  # deleted since the listing
            if is_sha256_hex(recorded):
                found.append(self._info(key, recorded, size))
            else:  # e.g. uploaded by `mc cp`: listed, flagged; reading it raises ArtifactCorrupted
                found.append(ArtifactInfo(uri=self._uri_for(key), key=key, sha256="", size=size,
                                          corruption=no_digest_message(self._uri_for(key), recorded)))
        return found

    def _list_dirs(self, prefix: str) -> Iterable[str]:
        start = (f"{self._prefix}/" if self._prefix else "") + prefix
        with self._errors():
            return [obj.object_name[len(start):].rstrip("/")
                    for obj in self._client.list_objects(self._bucket, prefix=start, recursive=False)
                    if obj.is_dir and obj.object_name]

    def _delete(self, key: str) -> None:
        with self._errors(key):
            self._client.remove_object(self._bucket, self._name(key))


def _chain(first: Iterable[bytes], rest: Iterable[bytes]) -> Iterator[bytes]:
    yield from first
    yield from rest
