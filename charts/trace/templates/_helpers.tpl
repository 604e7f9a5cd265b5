{{/*
Shared helpers. Naming: every resource is <fullname>-<component>; components are the five
services, vllm, minio, sandbox, training (Job pods) and buckets (hook Job).
*/}}

{{/* The five TRACE services, in port order. */}}
{{- define "trace.services" -}}
{{- list "rollout" "analysis" "environment" "trainer" "inference" | toJson -}}
{{- end -}}

{{- define "trace.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "trace.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* <fullname>-<component>; input: dict root, component. */}}
{{- define "trace.componentName" -}}
{{- printf "%s-%s" (include "trace.fullname" .root) .component | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels; input: dict root, component. Stable across upgrades (Deployment selectors are immutable). */}}
{{- define "trace.selectorLabels" -}}
app.kubernetes.io/name: {{ include "trace.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* All labels; input: dict root, component. */}}
{{- define "trace.labels" -}}
{{ include "trace.selectorLabels" . }}
app.kubernetes.io/part-of: trace
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Labels of objects a service creates at run time (training Jobs, sandbox pods); input: dict root, component, owner. */}}
{{- define "trace.createdLabels" -}}
{{ include "trace.selectorLabels" . }}
app.kubernetes.io/part-of: trace
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: trace-{{ .owner }}
{{- end -}}

{{/*
Image reference; input: dict root, image (repository, tag, pullPolicy), prefix (bool: apply
imageRegistry). An empty tag means the chart's appVersion; "latest" is refused.
*/}}
{{- define "trace.image" -}}
{{- $tag := .image.tag | default .root.Chart.AppVersion | toString -}}
{{- if eq $tag "latest" -}}
{{- fail (printf "image %s: the tag \"latest\" is not allowed; pin a version (empty = appVersion %s)" .image.repository .root.Chart.AppVersion) -}}
{{- end -}}
{{- $repo := .image.repository -}}
{{- if and .prefix .root.Values.imageRegistry -}}
{{- $repo = printf "%s/%s" (trimSuffix "/" .root.Values.imageRegistry) $repo -}}
{{- end -}}
{{- printf "%s:%s" $repo $tag -}}
{{- end -}}

{{/* Pod-level restricted security context. */}}
{{- define "trace.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.podSecurity.runAsUser }}
runAsGroup: {{ .Values.podSecurity.runAsGroup }}
fsGroup: {{ .Values.podSecurity.fsGroup }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Container-level restricted security context (read-only root; writable paths are emptyDirs). */}}
{{- define "trace.containerSecurityContext" -}}
runAsNonRoot: true
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
privileged: false
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "trace.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets -}}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- end -}}

{{/* GPUs a workload requests (0 = none); input: dict root, gpu (enabled, pool, count), min. */}}
{{- define "trace.gpuCount" -}}
{{- if .gpu.enabled -}}
{{- $pool := index .root.Values.gpuPools .gpu.pool -}}
{{- $n := int (.gpu.count | default $pool.gpusPerPod) -}}
{{- max $n (int (.min | default 0)) -}}
{{- else -}}
0
{{- end -}}
{{- end -}}

{{/*
nodeSelector / tolerations / affinity of a workload, with its GPU pool's added when gpu.enabled;
input: dict root, v (block with nodeSelector, tolerations, affinity, gpu). The block's own
nodeSelector entries win over the pool's on a key clash.
*/}}
{{- define "trace.scheduling" -}}
{{- $ns := deepCopy (.v.nodeSelector | default dict) -}}
{{- $tol := .v.tolerations | default list -}}
{{- if and .v.gpu .v.gpu.enabled -}}
{{- $pool := index .root.Values.gpuPools .v.gpu.pool -}}
{{- $ns = merge $ns (deepCopy ($pool.nodeSelector | default dict)) -}}
{{- $tol = concat $tol ($pool.tolerations | default list) -}}
{{- end -}}
{{- with $ns }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $tol }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .v.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Container resources plus nvidia.com/gpu (requests = limits) when count > 0; input: dict resources, count. */}}
{{- define "trace.resources" -}}
{{- $r := deepCopy (.resources | default dict) -}}
{{- $n := int .count -}}
{{- if gt $n 0 -}}
{{- $limits := $r.limits | default dict -}}
{{- $requests := $r.requests | default dict -}}
{{- $_ := set $limits "nvidia.com/gpu" $n -}}
{{- $_ := set $requests "nvidia.com/gpu" $n -}}
{{- $_ := set $r "limits" $limits -}}
{{- $_ := set $r "requests" $requests -}}
{{- end -}}
{{- toYaml $r -}}
{{- end -}}

{{/* Secret holding the auth token. */}}
{{- define "trace.authSecretName" -}}
{{- .Values.auth.existingSecret | default (include "trace.componentName" (dict "root" . "component" "auth")) -}}
{{- end -}}

{{/* host:port of the S3 server. */}}
{{- define "trace.s3Endpoint" -}}
{{- if and .Values.artifacts.s3.endpoint .Values.minio.enabled -}}
{{- fail "artifacts.s3.endpoint is set and minio.enabled is true: pick one store (minio.enabled=false for an external S3 server)" -}}
{{- else if .Values.artifacts.s3.endpoint -}}
{{- .Values.artifacts.s3.endpoint -}}
{{- else if .Values.minio.enabled -}}
{{- printf "%s:%d" (include "trace.componentName" (dict "root" . "component" "minio")) (int .Values.minio.service.port) -}}
{{- else -}}
{{- fail "artifacts.s3.endpoint is empty and minio.enabled is false: set artifacts.s3.endpoint=host:port of your S3 server, or minio.enabled=true" -}}
{{- end -}}
{{- end -}}

{{/* Secret holding the S3 credentials. */}}
{{- define "trace.s3SecretName" -}}
{{- if .Values.artifacts.s3.existingSecret -}}
{{- .Values.artifacts.s3.existingSecret -}}
{{- else if .Values.minio.enabled -}}
{{- include "trace.componentName" (dict "root" . "component" "minio") -}}
{{- else -}}
{{- fail "artifacts.s3.existingSecret is empty: with an external S3 endpoint, name the Secret holding its credentials (keys artifacts.s3.accessKeyKey / secretKeyKey)" -}}
{{- end -}}
{{- end -}}

{{- define "trace.artifactRoot" -}}
{{- $p := .Values.artifacts.prefix | trimAll "/" -}}
{{- if $p -}}
{{- printf "s3://%s/%s" .Values.artifacts.bucket $p -}}
{{- else -}}
{{- printf "s3://%s" .Values.artifacts.bucket -}}
{{- end -}}
{{- end -}}

{{/* In-cluster base URL of the vLLM server (…/v1). */}}
{{- define "trace.vllmBaseUrl" -}}
{{- printf "http://%s:%d/v1" (include "trace.componentName" (dict "root" . "component" "vllm")) (int .Values.vllm.service.port) -}}
{{- end -}}

{{- define "trace.vllmModelName" -}}
{{- .Values.vllm.servedModelName | default .Values.vllm.model -}}
{{- end -}}

{{/*
Artifact-store env vars (TRACE_<PREFIX>_*) with credentials by secretKeyRef only; input: dict root, prefix.
*/}}
{{- define "trace.artifactEnv" -}}
{{- $p := .prefix -}}
{{- $root := .root -}}
- name: TRACE_{{ $p }}_ARTIFACT_ROOT
  value: {{ include "trace.artifactRoot" $root | quote }}
- name: TRACE_{{ $p }}_S3_ENDPOINT
  value: {{ include "trace.s3Endpoint" $root | quote }}
- name: TRACE_{{ $p }}_S3_REGION
  value: {{ $root.Values.artifacts.s3.region | quote }}
- name: TRACE_{{ $p }}_S3_SECURE
  value: {{ $root.Values.artifacts.s3.secure | toString | quote }}
- name: TRACE_{{ $p }}_S3_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ include "trace.s3SecretName" $root }}
      key: {{ $root.Values.artifacts.s3.accessKeyKey }}
- name: TRACE_{{ $p }}_S3_SECRET_KEY
  valueFrom:
    secretKeyRef:
      name: {{ include "trace.s3SecretName" $root }}
      key: {{ $root.Values.artifacts.s3.secretKeyKey }}
{{- end -}}

{{/*
Env of a TRACE service container; input: dict root, name, v. Names follow
trace_common.config.ServiceSettings and services/<name>/settings.py (TRACE_<SERVICE>_<FIELD>):
every variable rendered here is a settings field (tests/chart/test_values.py). The one peer a
service calls is the trainer's environment service (TRACE_TRAINER_ENVIRONMENT_ADDRESS).
*/}}
{{- define "trace.serviceEnv" -}}
{{- $root := .root -}}
{{- $v := .v -}}
{{- $P := upper .name -}}
- name: TRACE_{{ $P }}_HOST
  value: "0.0.0.0"
- name: TRACE_{{ $P }}_PORT
  value: {{ $v.service.port | quote }}
- name: TRACE_{{ $P }}_METRICS_HOST
  value: "0.0.0.0"
- name: TRACE_{{ $P }}_METRICS_PORT
  value: {{ $v.metrics.port | quote }}
- name: TRACE_{{ $P }}_AUTH_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "trace.authSecretName" $root }}
      key: {{ $root.Values.auth.secretKey }}
{{- if $root.Values.tls.enabled }}
- name: TRACE_{{ $P }}_TLS_CERT_FILE
  value: /etc/trace/tls/tls.crt
- name: TRACE_{{ $P }}_TLS_KEY_FILE
  value: /etc/trace/tls/tls.key
{{- end }}
{{ include "trace.artifactEnv" (dict "root" $root "prefix" $P) }}
- name: TRACE_{{ $P }}_MAX_CONCURRENT_JOBS
  value: {{ $v.maxConcurrentJobs | quote }}
- name: TRACE_{{ $P }}_MAX_CONCURRENT_RPCS
  value: {{ $v.maxConcurrentRpcs | quote }}
- name: TRACE_{{ $P }}_MAX_PENDING_JOBS
  value: {{ $v.maxPendingJobs | quote }}
- name: TRACE_{{ $P }}_MAX_PENDING_BYTES
  value: {{ int64 $v.maxPendingBytes | quote }}
- name: TRACE_{{ $P }}_RETAINED_JOBS
  value: {{ $v.retainedJobs | quote }}
- name: TRACE_{{ $P }}_GRACE_SECONDS
  value: {{ $v.graceSeconds | quote }}
- name: TRACE_{{ $P }}_LOG_LEVEL
  value: {{ $v.logLevel | quote }}
{{- if and (eq .name "trainer") $root.Values.environment.enabled }}
- name: TRACE_TRAINER_ENVIRONMENT_ADDRESS
  value: {{ printf "%s:%d" (include "trace.componentName" (dict "root" $root "component" "environment")) (int $root.Values.environment.service.port) | quote }}
{{- if $root.Values.tls.enabled }}
- name: TRACE_TRAINER_ENVIRONMENT_TLS_CA_FILE
  value: {{ printf "/etc/trace/tls/%s" ($root.Values.tls.caKey | default "ca.crt") | quote }}
{{- end }}
{{- end }}
{{- if has .name (list "analysis" "environment" "rollout" "trainer") }}
{{ include "trace.endpointsEnv" (dict "root" $root "name" .name) }}
{{- end }}
{{- if and $root.Values.modelRoots (has .name (list "environment" "inference" "rollout" "trainer")) }}
- name: TRACE_{{ $P }}_MODEL_ROOTS
  value: {{ join "," $root.Values.modelRoots | quote }}
{{- end }}
{{- if and (eq .name "analysis") $v.rolloutRoots }}
- name: TRACE_ANALYSIS_ROLLOUT_ROOTS
  value: {{ $v.rolloutRoots | toJson | quote }}
{{- end }}
{{- if and (has .name (list "environment" "rollout" "trainer")) $v.dataRoots }}
- name: TRACE_{{ $P }}_DATA_ROOTS
  value: {{ $v.dataRoots | toJson | quote }}
{{- end }}
{{- if eq .name "inference" }}
- name: TRACE_INFERENCE_HTTP_HOST
  value: "0.0.0.0"
- name: TRACE_INFERENCE_HTTP_PORT
  value: {{ $v.http.port | quote }}
{{- $gpus := include "trace.gpuCount" (dict "root" $root "gpu" $v.gpu) | int }}
{{- if and (hasPrefix "cuda" $v.device) (eq $gpus 0) }}
{{- fail (printf "inference.device %q needs a GPU in the inference pod, and inference.gpu gives it none: enable inference.gpu (and a pool with GPUs), or leave inference.device empty (cpu then)" $v.device) }}
{{- end }}
{{- if and (hasPrefix "cuda:" $v.device) (ge (int (trimPrefix "cuda:" $v.device)) $gpus) }}
{{- fail (printf "inference.device %q names a GPU the inference pod does not have: it gets %d (cuda:0 to cuda:%d); leave inference.device empty (cuda) or raise inference.gpu.count" $v.device $gpus (sub $gpus 1)) }}
{{- end }}
- name: TRACE_INFERENCE_DEVICE
  value: {{ $v.device | default (ternary "cuda" "cpu" (gt $gpus 0)) | quote }}
- name: TRACE_INFERENCE_DTYPE
  value: {{ $v.dtype | quote }}
{{- end }}
{{- if eq .name "trainer" }}
- name: TRACE_TRAINER_KUBERNETES_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: TRACE_TRAINER_JOB_IMAGE
  value: {{ include "trace.image" (dict "root" $root "image" $v.image "prefix" true) | quote }}
- name: TRACE_TRAINER_JOB_TEMPLATE
  value: /etc/trace/templates/training-job.json
{{- with include "trace.adapterVolume" $root | fromYaml }}
- name: TRACE_TRAINER_VLLM_ADAPTER_ROOT
  value: {{ .mountPath | quote }}
{{- end }}
- name: TRACE_TRAINER_JOB_AUTH_FROM
  value: {{ printf "%s:%s" (include "trace.authSecretName" $root) $root.Values.auth.secretKey | quote }}
{{- end }}
{{- if eq .name "environment" }}
- name: TRACE_ENVIRONMENT_SANDBOX_BACKEND
  value: kubernetes
- name: TRACE_ENVIRONMENT_SANDBOX_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: TRACE_ENVIRONMENT_SANDBOX_POD_TEMPLATE
  value: /etc/trace/templates/sandbox-pod.json
{{- with $v.sandbox }}
- name: TRACE_ENVIRONMENT_SANDBOX_POD_CPU
  value: {{ .resources.limits.cpu | quote }}
- name: TRACE_ENVIRONMENT_SANDBOX_MEMORY_MB
  value: {{ include "trace.mebibytes" .resources.limits.memory | quote }}
- name: TRACE_ENVIRONMENT_SANDBOX_POD_DEADLINE_S
  value: {{ .activeDeadlineSeconds | quote }}
- name: TRACE_ENVIRONMENT_SANDBOX_POD_SCRATCH_MB
  value: {{ include "trace.mebibytes" .scratchSizeLimit | quote }}
{{- end }}
{{- end }}
- name: HOME
  value: /tmp
- name: TMPDIR
  value: /tmp
- name: HF_HOME
  value: /tmp/huggingface
{{- with $v.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
A memory quantity (Mi, Gi, M or G) in whole MiB, for settings that take MiB; other units fail.
*/}}
{{- define "trace.mebibytes" -}}
{{- $q := toString . -}}
{{- if hasSuffix "Gi" $q -}}{{ mul (trimSuffix "Gi" $q | int) 1024 }}
{{- else if hasSuffix "Mi" $q -}}{{ trimSuffix "Mi" $q | int }}
{{- else if hasSuffix "G" $q -}}{{ div (mul (trimSuffix "G" $q | int) 1000000000) 1048576 }}
{{- else if hasSuffix "M" $q -}}{{ div (mul (trimSuffix "M" $q | int) 1000000) 1048576 }}
{{- else -}}{{ fail (printf "memory quantity %q: write it in Mi or Gi (e.g. 1Gi)" $q) }}
{{- end -}}
{{- end -}}

{{/*
The outbound endpoints a calling service (analysis, environment, rollout; the trainer for vLLM
rollouts, which gets "vllm" and only the profiles whose `services` name it) may use; input: dict
root, name. Renders TRACE_<SVC>_ENDPOINTS, the JSON map profile -> {base_url, api_key_env, models}
that trace_common/endpoints.py reads, and one TRACE_ENDPOINT_KEY_<PROFILE> per profile with a key,
by secretKeyRef (the JSON names that variable, never the key). Profiles: "vllm" (the in-chart
server, endpoints.vllm), "llm" (llm.baseUrl, for analysis and environment) and endpoints.profiles.
*/}}
{{- define "trace.endpointsEnv" -}}
{{- $root := .root -}}
{{- $svc := .name -}}
{{- $profiles := dict -}}
{{- $keys := list -}}
{{- if and $root.Values.vllm.enabled $root.Values.endpoints.vllm -}}
{{- $_ := set $profiles "vllm" (dict "base_url" (include "trace.vllmBaseUrl" $root)) -}}
{{- end -}}
{{- $all := dict -}}
{{- with $root.Values.llm }}
{{- if .baseUrl -}}
{{- $_ := set $all "llm" (dict "baseUrl" .baseUrl "apiKeySecret" .apiKeySecret "models" (compact (list .model)) "services" (list "analysis" "environment")) -}}
{{- end -}}
{{- end -}}
{{- range $name, $e := $root.Values.endpoints.profiles -}}
{{- if hasKey $all $name -}}{{- fail (printf "endpoints.profiles.%s: the name is taken by the chart's own profile" $name) -}}{{- end -}}
{{- $_ := set $all $name $e -}}
{{- end -}}
{{- range $name, $e := $all -}}
{{- if and (eq $name "vllm") (hasKey $profiles "vllm") -}}{{- fail "endpoints.profiles.vllm: the name is taken by the in-chart vLLM profile (endpoints.vllm)" -}}{{- end -}}
{{- if has $svc ($e.services | default (list "analysis" "environment" "rollout")) -}}
{{- $p := dict "base_url" $e.baseUrl -}}
{{- with $e.models }}{{- $_ := set $p "models" . -}}{{- end -}}
{{- $secret := $e.apiKeySecret | default dict -}}
{{- if and $secret.name (eq $svc "trainer") -}}{{- fail (printf "endpoints.profiles.%s: the trainer sends no key to its vLLM server; remove trainer from services or the apiKeySecret" $name) -}}{{- end -}}
{{- if and $e.models (eq $svc "trainer") -}}{{- fail (printf "endpoints.profiles.%s: the trainer sends only its own adapter versions; remove trainer from services or the models" $name) -}}{{- end -}}
{{- if $secret.name -}}
{{- $var := printf "TRACE_ENDPOINT_KEY_%s" (upper (regexReplaceAll "[^a-zA-Z0-9]" $name "_")) -}}
{{- $_ := set $p "api_key_env" $var -}}
{{- $keys = append $keys (dict "env" $var "name" $secret.name "key" ($secret.key | default "api-key")) -}}
{{- end -}}
{{- $_ := set $profiles $name $p -}}
{{- end -}}
{{- end -}}
- name: TRACE_{{ upper $svc }}_ENDPOINTS
  value: {{ toJson $profiles | quote }}
{{- range $keys }}
- name: {{ .env }}
  valueFrom:
    secretKeyRef:
      name: {{ .name }}
      key: {{ .key }}
{{- end }}
{{- end -}}


{{/*
The vLLM adapter volume (vllm.adapterVolume) as YAML {existingClaim, mountPath} when the in-chart vLLM
is on and a claim is named, else empty: the training Jobs mount it, the vLLM server reads it, and the
trainer's TRACE_TRAINER_VLLM_ADAPTER_ROOT is its mount path.
*/}}
{{- define "trace.adapterVolume" -}}
{{- $a := .Values.vllm.adapterVolume -}}
{{- if and .Values.vllm.enabled $a.existingClaim -}}
{{- include "trace.checkMountPath" (dict "field" "vllm.adapterVolume.mountPath" "path" $a.mountPath "example" "/adapters" "others" list) -}}
{{- toYaml (dict "existingClaim" $a.existingClaim "mountPath" $a.mountPath) -}}
{{- end -}}
{{- end -}}


{{/*
The base-model weights volume (modelVolume) as YAML {existingClaim, mountPath, download} when a claim is
named, else empty: mounted read-only in vLLM, the rollout, environment, trainer and inference pods and the
training Jobs. mountPath may not be, contain or lie inside another mount of those pods; a download needs
the claim, one directory name under the mount, and the one vLLM pod whose init container runs it.
*/}}
{{- define "trace.modelVolume" -}}
{{- $m := .Values.modelVolume -}}
{{- if and $m.download.repo (not $m.existingClaim) -}}
{{- fail (printf "modelVolume.download.repo %q needs modelVolume.existingClaim: the claim it fills (a ReadWriteMany PVC you create)" $m.download.repo) -}}
{{- end -}}
{{- if $m.existingClaim -}}
{{- include "trace.checkMountPath" (dict "field" "modelVolume.mountPath" "path" $m.mountPath "example" "/weights" "others" (list $.Values.vllm.adapterVolume.mountPath)) -}}
{{- if $m.download.repo -}}
{{- if not (regexMatch "^[A-Za-z0-9][A-Za-z0-9._-]*$" $m.download.dir) -}}
{{- fail (printf "modelVolume.download.dir must be one directory name under modelVolume.mountPath (letters, digits, '.', '_', '-'), got %q; e.g. Qwen3-30B-A3B-Instruct-2507" $m.download.dir) -}}
{{- end -}}
{{- if not .Values.vllm.enabled -}}
{{- fail "modelVolume.download runs in the vLLM pod's init container, and vllm.enabled is false: enable vllm, or fill the claim yourself and leave modelVolume.download.repo empty" -}}
{{- end -}}
{{- if gt (int .Values.vllm.replicaCount) 1 -}}
{{- fail (printf "modelVolume.download with vllm.replicaCount %d: every replica's init container would write the same directory at once; install with one replica until the claim is filled, or fill it yourself and leave modelVolume.download.repo empty" (int .Values.vllm.replicaCount)) -}}
{{- end -}}
{{- end -}}
{{- toYaml (dict "existingClaim" $m.existingClaim "mountPath" $m.mountPath "download" $m.download) -}}
{{- end -}}
{{- end -}}


{{/*
The targets' data volume (dataVolume) as YAML {existingClaim, mountPath} when a claim is named, else empty:
mounted read-only in the rollout, environment and trainer pods and the training Jobs. mountPath may not be,
contain or lie inside another mount of those pods (the weights volume's included).
*/}}
{{- define "trace.dataVolume" -}}
{{- $d := .Values.dataVolume -}}
{{- if $d.existingClaim -}}
{{- $others := list $.Values.vllm.adapterVolume.mountPath -}}
{{- if $.Values.modelVolume.existingClaim }}{{- $others = append $others $.Values.modelVolume.mountPath }}{{- end -}}
{{- include "trace.checkMountPath" (dict "field" "dataVolume.mountPath" "path" $d.mountPath "example" "/data/tau2" "others" $others) -}}
{{- toYaml (dict "existingClaim" $d.existingClaim "mountPath" $d.mountPath) -}}
{{- end -}}
{{- end -}}


{{/*
Fails unless a volume's mountPath is an absolute path of plain directory names, clear of the chart's
own mounts (/tmp, /dev/shm, /models, /scratch, /etc/trace/tls, /etc/trace/templates), of `others`
(the other volumes' mount paths) and of the images' directories (trace.clearOfTheImage). Input: dict
field, path, example, others.
*/}}
{{- define "trace.checkMountPath" -}}
{{- if not (regexMatch "^(/[A-Za-z0-9_-][A-Za-z0-9._-]*)+$" .path) -}}
{{- fail (printf "%s must be an absolute path of plain directory names (no trailing '/', no '.' or '..'), got %q; e.g. %s" .field .path .example) -}}
{{- end -}}
{{- range $other := concat (list "/tmp" "/dev/shm" "/models" "/scratch" "/etc/trace/tls" "/etc/trace/templates") .others -}}
{{- if or (eq $.path $other) (hasPrefix (printf "%s/" $other) $.path) (hasPrefix (printf "%s/" $.path) $other) -}}
{{- fail (printf "%s %q overlaps %q, which the chart's pods mount already; choose another directory, e.g. %s" $.field $.path $other $.example) -}}
{{- end -}}
{{- end -}}
{{- include "trace.clearOfTheImage" (dict "field" .field "path" .path "example" .example) -}}
{{- end -}}


{{/*
Fails when a volume's mountPath would hide a directory of the images or of the kernel: it may not be,
or hold, /app (the services' code and prompts), /opt (their Python environment), /usr, /bin, /sbin,
/lib, /lib64, /etc, /var, /run, /root or /home, nor lie inside /app, /opt, /usr, /bin, /sbin, /lib,
/lib64, /etc (libraries, CA certificates), /proc, /sys or /dev.
Input: dict field, path, example.
*/}}
{{- define "trace.clearOfTheImage" -}}
{{- range $dir := list "/app" "/opt" "/usr" "/bin" "/sbin" "/lib" "/lib64" "/etc" "/var" "/run" "/root" "/home" "/proc" "/sys" "/dev" -}}
{{- $inside := and (has $dir (list "/app" "/opt" "/usr" "/bin" "/sbin" "/lib" "/lib64" "/etc" "/proc" "/sys" "/dev")) (hasPrefix (printf "%s/" $dir) $.path) -}}
{{- if or (eq $.path $dir) (hasPrefix (printf "%s/" $.path) $dir) $inside -}}
{{- fail (printf "%s %q would hide %s of the images or the kernel; choose a directory of its own, e.g. %s" $.field $.path $dir $.example) -}}
{{- end -}}
{{- end -}}
{{- end -}}
