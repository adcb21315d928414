#!/usr/bin/env python3
"""Extracts one file from a wheel on PyPI without downloading the wheel.

A wheel is a zip: its central directory (at the end) says where each member
lies, so HTTP range requests fetch only the directory and that member (a few
MiB of torch's 540 MiB wheel). Standard library only.

usage: wheel-member.py PROJECT VERSION FILENAME_GLOB MEMBER OUT
"""
import fnmatch, io, json, os, sys, tempfile, urllib.parse, urllib.request, zipfile


class RangeFile(io.RawIOBase):
    """A read-only, seekable view of a URL served with range requests."""

    def __init__(self, url):
        self.url, self.pos = url, 0
        req = urllib.request.Request(url, method="HEAD")
        with urllib.request.urlopen(req, timeout=60) as r:
            self.size = int(r.headers["Content-Length"])

    def seekable(self):
        return True

    def readable(self):
        return True

    def seek(self, off, whence=0):
        self.pos = {0: off, 1: self.pos + off, 2: self.size + off}[whence]
        return self.pos

    def tell(self):
        return self.pos

    def readinto(self, buf):
        if self.pos >= self.size or len(buf) == 0:
            return 0
        end = min(self.pos + len(buf), self.size) - 1
        req = urllib.request.Request(self.url, headers={"Range": f"bytes={self.pos}-{end}"})
        with urllib.request.urlopen(req, timeout=120) as r:
            if r.status != 206:
                sys.exit(f"{self.url}: the server ignored the range request (HTTP {r.status})")
            data = r.read()
        buf[: len(data)] = data
        self.pos += len(data)
        return len(data)


def main():
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    project, version, pattern, member, out = sys.argv[1:]
    meta_url = f"https://pypi.org/pypi/{project}/json"
    with urllib.request.urlopen(meta_url, timeout=60) as r:
        files = json.load(r)["releases"].get(version, [])
    wheels = [f for f in files if fnmatch.fnmatch(f["filename"], pattern)]
    if not wheels:
        sys.exit(f"{project} {version}: no file matches {pattern} on PyPI")
    url = urllib.parse.urljoin(meta_url, wheels[0]["url"])
    raw = RangeFile(url)
    with zipfile.ZipFile(io.BufferedReader(raw, buffer_size=1 << 20)) as z:
        data = z.read(member)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    # Written under a temporary name and renamed: never a half-written file.
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(out)))
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, out)
    print(f"{wheels[0]['filename']}: {member} ({len(data)} bytes) -> {out}")


if __name__ == "__main__":
    main()
