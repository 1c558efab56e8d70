#!/usr/bin/env bash
# Create .venv and install dlrover-ray with pinned, CPU-only dependencies.
#
# Why not a plain `pip install -e .`: torchrec declares a dependency on the CUDA
# build `fbgemm-gpu`, which fails to import on a CPU-only machine. We install
# torchrec with --no-deps next to `fbgemm-gpu-cpu` plus torchrec's small runtime
# dependencies, and make sure the CUDA wheel is absent.
#
# GPU variant (documented, not exercised by CI): set DLROVER_GPU=1 to install
#   torch==2.13.0 (CUDA build from the PyTorch index) + fbgemm-gpu==1.8.0 instead of
#   fbgemm-gpu-cpu. Everything else is identical.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VENV:-.venv}

TORCH=torch==2.13.0
FBGEMM=fbgemm-gpu-cpu==1.8.0
TORCHREC=torchrec==1.8.0
if [[ "${DLROVER_GPU:-0}" == "1" ]]; then FBGEMM=fbgemm-gpu==1.8.0; fi

if [[ ! -x "$VENV/bin/python" ]]; then
  echo "[install] creating $VENV"
  "$PY" -m venv "$VENV"
fi
PIP="$VENV/bin/python -m pip"
# pip here may be configured with extra local indexes that do not exist: drop that noise.
pipi() { $PIP install -q --progress-bar off "$@" 2>&1 | sed -e '/is ignored: it is neither/d' -e '/requires fbgemm-gpu, which is not installed/d' -e "/dependency resolver does not currently/d"; }
pipi --upgrade pip wheel setuptools
echo "[install] torch + fbgemm + torchrec (no-deps)"
pipi "$TORCH" "$FBGEMM"
pipi --no-deps "$TORCHREC"
pipi tensordict==0.15.3 torchmetrics==1.0.3 tqdm==4.67.1 pyre-extensions==0.0.32 iopath==0.1.10
echo "[install] project + runtime dependencies"
pipi -e ".[test,tracking]"
if [[ "${DLROVER_GPU:-0}" != "1" ]] && $VENV/bin/python -m pip show fbgemm-gpu >/dev/null 2>&1; then
  echo "[install] removing CUDA fbgemm-gpu (breaks CPU import)"
  $PIP uninstall -y -q fbgemm-gpu
fi
$VENV/bin/python - <<'PY'
import torch, fbgemm_gpu, torchrec, ray  # noqa: F401
from fbgemm_gpu.split_table_batched_embeddings_ops_training import SplitTableBatchedEmbeddingBagsCodegen  # noqa: F401
print(f"[install] ok: torch {torch.__version__}, torchrec {torchrec.__version__ if hasattr(torchrec,'__version__') else '?'}, ray {ray.__version__}")
PY
# The MLflow tracking server that tests/test_tracking.py starts, in a venv of its own: the
# full `mlflow` package pins pyarrow<26, which .venv cannot have (ray's pyarrow); .venv has
# only the client, mlflow-skinny, of the same version (docs/decisions/experiment-tracking.md).
# DLROVER_MLFLOW_SERVER=0 leaves it out (the image: jobs need only the client).
MLFLOW=mlflow==3.17.2
MLFLOW_VENV=${MLFLOW_VENV:-.venv-mlflow}
if [[ "${DLROVER_MLFLOW_SERVER:-1}" != "0" ]] && ! "$MLFLOW_VENV/bin/python" -m pip show mlflow 2>/dev/null | grep -qx "Version: ${MLFLOW#mlflow==}"; then
  echo "[install] $MLFLOW (the tracking server of the tests) in $MLFLOW_VENV"
  [[ -x "$MLFLOW_VENV/bin/python" ]] || "$PY" -m venv "$MLFLOW_VENV"
  "$MLFLOW_VENV/bin/python" -m pip install -q --progress-bar off "$MLFLOW" 2>&1 | sed -e '/is ignored: it is neither/d'
fi
# Optional system tools, Debian packages installed only where apt-get runs as root:
# headless Chromium renders `dlrover report` pages in a test, Prometheus scrapes a real
# job for the dashboard test (`make dashboards-check`). Tests that need them skip without.
if command -v apt-get >/dev/null 2>&1 && [[ "$(id -u)" == 0 ]]; then
  missing=()
  command -v chromium >/dev/null 2>&1 || missing+=(chromium)
  command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
  if (( ${#missing[@]} )); then
    echo "[install] ${missing[*]} (Debian packages, for the report and dashboard tests)"
    export DEBIAN_FRONTEND=noninteractive
    apt_get() { timeout 600 apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null 2>&1; }
    apt_get || { timeout 300 apt-get update -q >/dev/null 2>&1 && apt_get; } || echo "[install] ${missing[*]} not installed: the tests that need them will be skipped"
  fi
fi
touch "$VENV/.installed"
