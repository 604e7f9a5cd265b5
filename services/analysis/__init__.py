"""Analysis service: contrastive capability analysis of stored trajectories (TRACE step 2).

Modules, in the order a job uses them:
  artifacts_io      read rollout JSONL artifacts (sha256-verified), write the report files
  diagnostics_mode  labels from environment diagnostics; bootstrap runs
  compaction        trajectory -> budgeted JSON view (untrusted text stays data)
  prompts           prompts/analysis/*.md templates and the delimited data blocks
  schemas           JSON schemas of the analyst's replies and their validation
  analyst           OpenAI-compatible requests with validation retries and bounded parallelism
  discovery         one request proposing candidate capabilities
  labeling          N independent labeling runs (LLM mode) and the LabelRun record
  stats             Cov, ER-, ER+, Delta, K-of-N retention, Cohen's kappa (docs/design.md)
  result            per-candidate outcomes, evidence, kappa; report.json
  report, plots     report.md and the PNG plots
  job               the job body tying them together
  service, servicer domain object (jobs) and the gRPC translation
"""
