#!/usr/bin/env bash
# Static checks of the deployment files, without pytest: helm lint, promtool, hadolint, and the
# dashboard generator's drift check. The full suite (rendered-manifest validation, pod security,
# schema rejections, rule unit tests) is `pytest tests/chart`.
set -euo pipefail
cd "$(dirname "$0")/.."
HELM=.tools/bin/helm PROMTOOL=.tools/bin/promtool HADOLINT=.venv/bin/hadolint
for t in "$HELM" "$PROMTOOL" "$HADOLINT"; do
  [ -x "$t" ] || { echo "missing $t: run scripts/install_tools.sh" >&2; exit 1; }
done
"$HELM" lint --strict charts/trace
"$PROMTOOL" check rules charts/trace/files/prometheus-rules.yaml
"$PROMTOOL" test rules tests/chart/rules_test.yaml
"$HADOLINT" --failure-threshold info Dockerfile.*
.venv/bin/python charts/trace/dashboards/generate_dashboard.py --check
echo "chart checks passed"
