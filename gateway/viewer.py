"""The web DICOM viewer (OHIF) behind the gateway: its static files, its configuration, its
Content-Security-Policy and the URLs that open a series in it.

OHIF's prebuilt package expects to be served at ``/`` (absolute asset paths, webpack's public
path "/"); the gateway serves it under ``/review/viewer/``, inside the review session cookie's
path, so index.html, the webpack runtimes and the stylesheets are rewritten once when first
served. The dist's own configuration and service worker are never served: the gateway writes
the configuration (one DICOMweb data source, the gateway's read-only proxy of Orthanc), so the
browser talks to the gateway only and never holds an Orthanc password.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode

from dicom import check_uid

BASE = "/review/viewer"  # where the viewer lives (inside the review cookie's path)
DICOMWEB_ROOT = f"{BASE}/dicom-web"  # the gateway's DICOMweb proxy, as the browser sees it
OPEN_PATH = f"{BASE}/open"
OHIF_ROUTE = "viewer"  # the route of OHIF's basic viewer mode
PLANES = ("sagittal", "coronal", "axial")  # index = the RAS axis along the slice normal

# Files of the dist that are never served: its configurations (ours replaces them), the
# service worker and its loader (no offline cache of patient images in the browser), and
# deployment files of other web servers.
_WITHHELD = frozenset(
    {"app-config.js", "google.js", "sw.js", "init-service-worker.js", "_headers",
     "_redirects", "serve.json", "index.html"}
)  # fmt: skip
_SEGMENT = re.compile(r"^[A-Za-z0-9_@+~-][A-Za-z0-9._@+~-]{0,199}$")
# Content-hashed names (app.bundle.0f6159c501addfe9.js, 34b1e6b1deb5828e.wasm) never change.
_HASHED = re.compile(r"(^|\.)[0-9a-f]{16}\.(js|wasm|woff2?|css)$")
_TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".html": "text/html; charset=utf-8",
    ".json": "application/json",
    ".jsonc": "application/json",
    ".wasm": "application/wasm",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
    ".woff2": "font/woff2",
    ".woff": "font/woff",
    ".ttf": "font/ttf",
    ".xml": "application/xml",
    ".txt": "text/plain; charset=utf-8",
    ".map": "application/json",
}
_RUNTIME_PATH = b'__webpack_require__.p = "/";'  # webpack's public path in each runtime
_CSS_URL = re.compile(rb"url\((['\"]?)/(?!/)")
_HTML_REF = re.compile(r'(\s(?:src|href))="/(?!/)')
_INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>", re.S)
_SW_LOADER = re.compile(r"<script[^>]*init-service-worker\.js[^>]*></script>")


class ViewerNotInstalledError(RuntimeError):
    """OHIF's static files are not where the settings say (run `make setup`)."""


class ViewerFileError(RuntimeError):
    """The installed OHIF is not laid out as this gateway expects (another version?)."""


@dataclass(frozen=True)
class Asset:
    """One static file to send: bytes (rewritten) or a path (sent as it is)."""

    media_type: str
    cache_control: str
    path: Path | None = None
    body: bytes | None = None


@dataclass(frozen=True)
class IndexPage:
    html: str
    script_hashes: tuple[str, ...]  # CSP sources of the inline scripts ('sha256-...')


class ViewerFiles:
    """OHIF's dist folder: safe lookup of its files and the rewrites they need under BASE."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock = threading.Lock()
        self._patched: dict[str, tuple[tuple[int, int], bytes | None]] = {}
        self._index: tuple[tuple[int, int], IndexPage] | None = None

    def check(self) -> None:
        if not (self.root / "index.html").is_file():
            raise ViewerNotInstalledError(
                f"the web DICOM viewer (OHIF) is not installed at {self.root}: run `make setup` "
                "(it runs `npm ci` in viewer/), or set NEUROSANDBOX_VIEWER_DIR to OHIF's dist folder"
            )

    def index(self) -> IndexPage:
        """index.html with every absolute reference moved under BASE and no service worker."""
        self.check()
        path = self.root / "index.html"
        key = _stamp(path)
        with self._lock:
            if self._index is not None and self._index[0] == key:
                return self._index[1]
        page = rewrite_index(path.read_text(encoding="utf-8"))
        with self._lock:
            self._index = (key, page)
        return page

    def asset(self, rel: str) -> Asset | None:
        """The file ``rel`` of the dist (None: no such servable file)."""
        path = self._resolve(rel)
        if path is None:
            return None
        suffix = path.suffix.lower()
        media = _TYPES.get(suffix, "application/octet-stream")
        cache = "private, max-age=31536000, immutable" if _HASHED.search(path.name) else "no-cache"
        if suffix in (".js", ".css"):
            body = self._rewritten(path, rel, suffix)
            if body is not None:
                return Asset(media, cache, body=body)
        return Asset(media, cache, path=path)

    @staticmethod
    def client_route(rel: str) -> bool:
        """True for a path OHIF's router handles in the browser (served index.html)."""
        parts = rel.split("/")
        return (
            rel not in _WITHHELD and "." not in parts[-1] and all(_SEGMENT.match(p) for p in parts)
        )

    def _resolve(self, rel: str) -> Path | None:
        parts = rel.split("/")
        if not rel or rel in _WITHHELD or not all(_SEGMENT.match(p) for p in parts):
            return None  # also refuses "", ".", "..", hidden files, backslashes and NULs
        self.check()
        root = self.root.resolve()
        path = (root / Path(*parts)).resolve()
        if not path.is_relative_to(root) or not path.is_file():
            return None  # a symlink out of the dist, a folder, a device...
        return path

    def _rewritten(self, path: Path, rel: str, suffix: str) -> bytes | None:
        """The file with its root-relative references moved under BASE; None: nothing to move."""
        key = _stamp(path)
        with self._lock:
            hit = self._patched.get(rel)
        if hit is not None and hit[0] == key:
            return hit[1]
        data = path.read_bytes()
        if suffix == ".js":
            new = data.replace(_RUNTIME_PATH, f'__webpack_require__.p = "{BASE}/";'.encode())
        else:
            new = _CSS_URL.sub(lambda m: b"url(" + m.group(1) + BASE.encode() + b"/", data)
        out = new if new != data else None
        with self._lock:
            self._patched[rel] = (key, out)
        return out


def _stamp(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_mtime_ns, st.st_size


def rewrite_index(html: str) -> IndexPage:
    """OHIF's index.html served under BASE: public URL, asset references, no service worker."""
    if 'window.PUBLIC_URL="/"' not in html or 'src="/app-config.js"' not in html:
        raise ViewerFileError(
            "OHIF's index.html does not look like the one of @ohif/app 3.13 (no PUBLIC_URL or "
            "app-config.js reference): install the version pinned in viewer/package-lock.json"
        )
    html = html.replace('window.PUBLIC_URL="/"', f'window.PUBLIC_URL="{BASE}/"')
    html = _SW_LOADER.sub("", html)
    html = _HTML_REF.sub(lambda m: f'{m.group(1)}="{BASE}/', html)
    hashes = tuple(
        "'sha256-" + base64.b64encode(hashlib.sha256(s.encode()).digest()).decode() + "'"
        for s in _INLINE_SCRIPT.findall(html)
    )
    return IndexPage(html, hashes)


def content_security_policy(script_hashes: tuple[str, ...]) -> str:
    """As tight as OHIF runs with: its own scripts and the index's inline ones, WebAssembly
    (the image codecs), workers, and connections to this origin only (DICOMweb is proxied).

    ``object-src blob:`` lets OHIF's PDF viewport show an Encapsulated PDF (the checklist PDF
    series): it reads the document's bytes through the read-only proxy (connect-src 'self')
    and hands the browser's PDF viewer a blob: URL in an <object>. Only blob: is allowed, not
    'self' nor any host: a blob: URL is made by script of this page, and only OHIF's own
    scripts run here, so no other document can be embedded; a blob: document inherits this
    policy (no inline script runs in it), and the proxy's answers are sent with nosniff, so
    the PACS's bytes cannot be loaded as script either. Every other page of the gateway keeps
    object-src 'none' (review pages: ``evaluation.reports.html.csp``; the viewer's own error
    pages: default-src 'none')."""
    return "; ".join(
        [
            "default-src 'none'",
            "script-src 'self' 'wasm-unsafe-eval' " + " ".join(script_hashes),
            "worker-src 'self' blob:",
            "connect-src 'self'",
            "img-src 'self' data: blob:",
            "style-src 'self' 'unsafe-inline'",  # React sets style attributes
            "font-src 'self' data:",
            "media-src 'self' blob:",
            "manifest-src 'self'",
            "frame-src 'self' blob:",
            "object-src blob:",  # OHIF's PDF viewport (see the docstring)
            "base-uri 'self'",
            "form-action 'self'",
            "frame-ancestors 'self'",
        ]
    )


def app_config_js() -> str:
    """OHIF's window.config: the gateway's DICOMweb proxy as the only data source, no study
    list, no service worker, no CPU-rendering, investigational-use or onboarding pop-ups, CPU
    rendering where the browser has no WebGL, no external URL."""
    dicomweb = {
        "friendlyName": "NeuroSandbox PACS",
        "name": "orthanc",
        "qidoSupportsIncludeField": False,
        "imageRendering": "wadors",
        "thumbnailRendering": "wadors",
        "enableStudyLazyLoad": True,
        "supportsFuzzyMatching": False,
        "supportsWildcard": True,
        "supportsReject": False,
        "dicomUploadEnabled": False,
        "omitQuotationForMultipartRequest": True,  # Orthanc's multipart parser
        "bulkDataURI": {"enabled": True},
    }
    config = {
        "routerBasename": BASE,
        "showStudyList": False,
        "extensions": [],
        "modes": [],
        "customizationService": {"ohif.tours": {"$set": []}},  # no onboarding pop-ups
        "maxNumberOfWebWorkers": 3,
        "showWarningMessageForCrossOrigin": False,
        "showCPUFallbackMessage": False,
        "showLoadingIndicator": True,
        "strictZSpacingForVolumeViewport": True,
        "investigationalUseDialog": {"option": "never"},
        "disableConfirmationPrompts": True,
        "maxNumRequests": {"interaction": 100, "thumbnail": 5, "prefetch": 10},
        "showErrorDetails": "always",
        "defaultDataSourceName": "pacs",
        "dataSources": [
            {
                "namespace": "@ohif/extension-default.dataSourcesModule.dicomweb",
                "sourceName": "pacs",
                "configuration": dicomweb,
            }
        ],
    }
    # The roots are absolute URLs of this origin, made in the browser (the Host header a
    # request arrives with is not trusted to name the origin). The header's logo is a link
    # back to the review queue. Without WebGL, OHIF must be told to render on the CPU (it
    # overrides Cornerstone's own detection and then fails creating a WebGL context).
    return (
        "// Written by the NeuroSandbox gateway (gateway/viewer.py); the dist's app-config.js is not served.\n"
        f"window.config = {json.dumps(config, indent=2)};\n"
        "(function (config) {\n"
        f"  var root = window.location.origin + {json.dumps(DICOMWEB_ROOT)};\n"
        "  var source = config.dataSources[0].configuration;\n"
        "  source.wadoUriRoot = root;\n"
        "  source.qidoRoot = root;\n"
        "  source.wadoRoot = root;\n"
        "  config.whiteLabeling = {\n"
        "    createLogoComponentFn: function (React) {\n"
        "      return React.createElement('a', {href: '/review', className: 'text-primary-light text-base',\n"
        "        title: 'Back to the review queue'}, 'NeuroSandbox review');\n"
        "    },\n"
        "  };\n"
        # OHIF 3.13 reads coords[0] of every TID 1500 measurement group of an SR, and only the
        # gateway's pointed findings have spatial coordinates (diagnoses and unpointed findings
        # have none): without this the AI SR fails to load ("Something went wrong"). A group
        # without coordinates gets an empty entry, no geometry and no image reference, so OHIF
        # skips it quietly.
        "  config.customizationService.onBeforeSRAddMeasurement = {$set: function (args) {\n"
        "    var m = args.measurement;\n"
        "    if (!m.coords || !m.coords.length) { m.coords = [{}]; }\n"
        "    return m;\n"
        "  }};\n"
        "  var probe = document.createElement('canvas');\n"
        "  if (!(probe.getContext('webgl2') || probe.getContext('webgl'))) {\n"
        "    config.useCPURendering = true;\n"
        "  }\n"
        "})(window.config);\n"
    )


def viewer_url(
    study_uid: str, series_uid: str, sop_uid: str | None = None, whole_study: bool = False
) -> str:
    """OHIF's URL showing one series of a study, opened at one instance when ``sop_uid`` is
    given (OHIF's hanging protocol places the series named by initialSeriesInstanceUID first
    and opens it at the index of initialSOPInstanceUID). ``whole_study``: every series of the
    study is loaded (the AI SR and the checklist PDF among them); otherwise that series only."""
    query = {"StudyInstanceUIDs": check_uid(study_uid)}
    if not whole_study:
        query["SeriesInstanceUIDs"] = check_uid(series_uid)
    query["initialSeriesInstanceUID"] = check_uid(series_uid)
    if sop_uid is not None:
        query["initialSOPInstanceUID"] = check_uid(sop_uid)
    return f"{BASE}/{OHIF_ROUTE}?{urlencode(query)}"


def viewer_open_url(
    study_uid: str, series_uid: str | None = None, z_mm: float | None = None,
    plane: str | None = None,
) -> str:  # fmt: skip
    """The gateway's link that opens a series in the viewer at the slice nearest ``z_mm``.

    ``z_mm`` is a position as montage tiles record it (``RenderedImage.slice_positions_mm``):
    the RAS coordinate of the slice centre along the axis of ``plane`` (axial: S, coronal: A,
    sagittal: R); without ``plane``, the axis of the series' own slices. Without ``z_mm``, the
    middle slice. Without ``series_uid``, the whole study, opened at the middle slice of the
    series the gateway chooses (``viewer_pacs.opening_series``). Raises ``InvalidUIDError`` for
    a string that is not a DICOM UID.
    """
    query: dict[str, str] = {"study": check_uid(study_uid)}
    if series_uid is not None:
        query["series"] = check_uid(series_uid)
    if z_mm is not None:
        query["z"] = f"{float(z_mm):.2f}"
    if plane is not None:
        if plane not in PLANES:
            raise ValueError(f"plane must be one of {', '.join(PLANES)}, not {plane!r}")
        query["plane"] = plane
    return f"{OPEN_PATH}?{urlencode(query)}"
