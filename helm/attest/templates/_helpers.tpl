{{/* Names and labels. */}}
{{- define "attest.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "attest.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Name of one component (service, worker pool, tgi): <fullname>-<component>. */}}
{{- define "attest.componentName" -}}
{{- printf "%s-%s" (include "attest.fullname" .root) .component | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "attest.selectorLabels" -}}
app.kubernetes.io/name: {{ include "attest.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "attest.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{ include "attest.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: attest
{{- end -}}

{{- define "attest.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "attest.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* image: repository@digest, else repository:tag (tag defaults to appVersion). */}}
{{- define "attest.image" -}}
{{- $img := ternary .root.Values.images.gpu .root.Values.images.cpu .gpu -}}
{{- if $img.digest -}}
{{- printf "%s@%s" $img.repository $img.digest -}}
{{- else -}}
{{- printf "%s:%s" $img.repository (default .root.Chart.AppVersion $img.tag) -}}
{{- end -}}
{{- end -}}

{{/*
The peers one process calls: its `peers`, then those of its `optionalPeers`
that are enabled (the knowledge service is called once it is deployed).
Input: dict "root" "cfg" (a services.* or workers.* entry). Output: a JSON
list, read back with fromJsonArray.
*/}}
{{- define "attest.peers" -}}
{{- $peers := .cfg.peers | default list -}}
{{- range (.cfg.optionalPeers | default list) -}}
{{- if (index $.root.Values.services . | default dict).enabled -}}
{{- $peers = append $peers . -}}
{{- end -}}
{{- end -}}
{{- $peers | uniq | toJson -}}
{{- end -}}

{{/* dns:/// address of a peer service: every pod behind the headless Service. */}}
{{- define "attest.peerAddress" -}}
{{- $svc := index .root.Values.services .peer -}}
{{- printf "dns:///%s:%d" (include "attest.componentName" (dict "root" .root "component" .peer)) (int $svc.port) -}}
{{- end -}}

{{/*
Settings as environment variables: a map becomes PREFIX_KEY=value, nested maps
PREFIX_KEY__SUB=value, lists and maps below the top level as JSON (the form
pydantic-settings parses). Input: dict "prefix" "ATTEST_X_" "settings" map.
*/}}
{{- define "attest.settingsEnv" -}}
{{- $prefix := .prefix -}}
{{- range $key, $value := .settings }}
{{- $name := printf "%s%s" $prefix (upper $key) }}
{{- if kindIs "map" $value }}
{{- include "attest.settingsEnv" (dict "prefix" (printf "%s__" $name) "settings" $value) }}
{{- else }}
- name: {{ $name }}
  value: {{ ternary ($value | toJson) ($value | toString) (kindIs "slice" $value) | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* One variable from an existing Secret: dict "name" "secret" "key". */}}
{{- define "attest.secretEnv" -}}
- name: {{ .name }}
  valueFrom:
    secretKeyRef:
      name: {{ .secret }}
      key: {{ .key }}
{{- end -}}

{{/* Variables every Attest process gets: offline model hubs, a writable home. */}}
{{- define "attest.baseEnv" -}}
- name: HF_HUB_OFFLINE
  value: "1"
- name: TRANSFORMERS_OFFLINE
  value: "1"
- name: HOME
  value: /tmp
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
{{- with .Values.tracing }}
{{- if .otlpEndpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ .otlpEndpoint | quote }}
- name: OTEL_TRACES_SAMPLER
  value: {{ .sampler | default "parentbased_traceidratio" | quote }}
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ .samplerArg | default "0.1" | quote }}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: "k8s.pod.name=$(POD_NAME)"
{{- end }}
{{- end }}
{{- end -}}

{{/* Egress to the trace collector, while tracing is on. Input: the chart context. */}}
{{- define "attest.tracingEgress" -}}
{{- if .Values.tracing.otlpEndpoint }}
{{- include "attest.backendEgress" (dict "root" . "backend" "tracing") }}
{{- end }}
{{- end -}}

{{/* Celery broker and result backend of the pipeline, under a prefix. */}}
{{- define "attest.redisEnv" -}}
{{- $redis := .root.Values.endpoints.redis -}}
{{- if $redis.existingSecret }}
{{ include "attest.secretEnv" (dict "name" (printf "%sBROKER_URL" .prefix) "secret" $redis.existingSecret "key" $redis.brokerUrlKey) }}
{{ include "attest.secretEnv" (dict "name" (printf "%sRESULT_BACKEND_URL" .prefix) "secret" $redis.existingSecret "key" $redis.resultBackendUrlKey) }}
{{ include "attest.secretEnv" (dict "name" (printf "%sSTATE_URL" .prefix) "secret" $redis.existingSecret "key" $redis.stateUrlKey) }}
{{- else }}
- name: {{ .prefix }}BROKER_URL
  value: {{ $redis.brokerUrl | quote }}
- name: {{ .prefix }}RESULT_BACKEND_URL
  value: {{ $redis.resultBackendUrl | quote }}
- name: {{ .prefix }}STATE_URL
  value: {{ $redis.stateUrl | quote }}
{{- end }}
{{- end -}}

{{/* GPU scheduling: node selector and tolerations merged with the component's own. */}}
{{- define "attest.scheduling" -}}
{{- $nodeSelector := .cfg.nodeSelector | default dict -}}
{{- $tolerations := .cfg.tolerations | default list -}}
{{- if .cfg.gpu.enabled -}}
{{- $nodeSelector = merge (deepCopy $nodeSelector) (.cfg.gpu.nodeSelector | default dict) -}}
{{- $tolerations = concat $tolerations (.cfg.gpu.tolerations | default list) -}}
{{- end -}}
{{- with $nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .cfg.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* OMP_NUM_THREADS for a container: the component's `threads`, else its CPU
limit (or, without one, its request) shared by its `processes`, rounded up,
at least 1; none without either. Without it ONNX Runtime and torch size
their pools by the node's cores, dozens of threads in a pod that may use
one. A CPU in another unit than cores or millicores fails the render (unless
`threads` is set; then the CPU sizes nothing).
With a CPU, also PYTHON_CPU_COUNT, that share of the CPU rounded up: the
CPUs a process counts as its own (a pod with a request and no limit has no
quota, and sees every core of the node). Attest sizes its concurrent ONNX
passes by it, and CPython 3.13 its os.cpu_count.
Input: dict "cfg" the component's values, "processes" worker processes per
container. */}}
{{- define "attest.threadsEnv" -}}
{{- $threads := int (.cfg.threads | default 0) -}}
{{- $res := .cfg.resources | default dict -}}
{{- $cpu := toString (dig "limits" "cpu" "" $res | default (dig "requests" "cpu" "" $res)) -}}
{{- $own := 0 -}}
{{- if $cpu -}}
{{- if regexMatch "^[0-9]+(\\.[0-9]+)?m?$" $cpu -}}
{{- $cores := ternary (divf (trimSuffix "m" $cpu) 1000) (float64 $cpu) (hasSuffix "m" $cpu) -}}
{{- $own = max 1 (int (ceil (divf $cores (.processes | default 1)))) -}}
{{- else if not $threads -}}
{{- fail (printf "resources cpu %q: give cores (2, 0.5) or millicores (500m), or set threads" $cpu) -}}
{{- end -}}
{{- end -}}
{{- if not $threads -}}
{{- $threads = $own -}}
{{- end -}}
{{- if $threads -}}
- name: OMP_NUM_THREADS
  value: {{ $threads | quote }}
{{- end -}}
{{- if $own }}
- name: PYTHON_CPU_COUNT
  value: {{ $own | quote }}
{{- end -}}
{{- end -}}

{{/* Container resources; a GPU component gets nvidia.com/gpu in its limits. */}}
{{- define "attest.resources" -}}
{{- $resources := deepCopy (.cfg.resources | default dict) -}}
{{- if .cfg.gpu.enabled -}}
{{- $limits := $resources.limits | default dict -}}
{{- $_ := set $limits "nvidia.com/gpu" (int .cfg.gpu.count) -}}
{{- $_ := set $resources "limits" $limits -}}
{{- end -}}
{{- toYaml $resources -}}
{{- end -}}

{{/*
One gRPC service: Deployment, headless Service (peers resolve every pod),
optional external Service, HPA, PDB, NetworkPolicy and a data volume for the
embedded backends. Input: dict
  "root"      the chart context
  "name"      service name (answer, lexical, ...), also the `attest serve` argument
  "env"       map of settings this service's template wires (KEY -> string)
  "secretEnv" list of dict name/secret/key (full variable names)
  "backends"  list of networkPolicy.backends entries this service reaches
  "redisPrefix" when set, the pipeline's Redis URLs under this prefix
  "volumes" / "volumeMounts"  extra ones (lists)
*/}}
{{- define "attest.grpcService" -}}
{{- $root := .root -}}
{{- $name := .name -}}
{{- $cfg := index $root.Values.services $name -}}
{{- if $cfg.enabled -}}
{{- $ctx := dict "root" $root "component" $name -}}
{{- $full := include "attest.componentName" $ctx -}}
{{- $prefix := printf "ATTEST_%s_" (upper $name) -}}
{{- $dataVolume := or $cfg.persistence.enabled $cfg.persistence.existingClaim -}}
{{- $public := has $name (list "answer" "ingest") -}}
{{- if and $cfg.externalService.enabled (not $public) -}}
{{- fail (printf "services.%s.externalService: %s is internal (service identities only); only answer and ingest are served outside the release" $name $name) -}}
{{- end -}}
{{- $peers := include "attest.peers" (dict "root" $root "cfg" $cfg) | fromJsonArray -}}
{{- $security := dict "root" $root "prefix" $prefix "server" true "public" $public "caller" (gt (len $peers) 0) "identity" "SERVER__IDENTITY__" -}}
{{- range $peers }}
{{- $peer := index $root.Values.services . | default dict }}
{{- if not $peer.enabled }}
{{- fail (printf "services.%s.peers names %q, which is not an enabled service" $name .) }}
{{- end }}
{{- end }}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ $full }}
  labels:
    {{- include "attest.labels" $ctx | nindent 4 }}
spec:
  {{- if not $cfg.autoscaling.enabled }}
  replicas: {{ $cfg.replicas }}
  {{- end }}
  revisionHistoryLimit: 5
  {{- if $dataVolume }}
  # A ReadWriteOnce volume cannot be shared by the old and the new pod.
  strategy:
    type: Recreate
  {{- end }}
  selector:
    matchLabels:
      {{- include "attest.selectorLabels" $ctx | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "attest.labels" $ctx | nindent 8 }}
        {{- with $root.Values.podLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      annotations:
        {{- if $root.Values.metrics.enabled }}
        prometheus.io/scrape: "true"
        prometheus.io/port: {{ $root.Values.metrics.port | quote }}
        {{- end }}
        {{- with $root.Values.podAnnotations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
    spec:
      serviceAccountName: {{ include "attest.serviceAccountName" $root }}
      automountServiceAccountToken: false
      {{- with $root.Values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext:
        {{- toYaml $root.Values.podSecurityContext | nindent 8 }}
      # Past the server's own drain (ServerSettings.grace_seconds, 10 s).
      terminationGracePeriodSeconds: 30
      {{- include "attest.scheduling" (dict "cfg" $cfg) | nindent 6 }}
      containers:
        - name: {{ $name }}
          image: {{ include "attest.image" (dict "root" $root "gpu" $cfg.gpu.enabled) }}
          imagePullPolicy: {{ (ternary $root.Values.images.gpu $root.Values.images.cpu $cfg.gpu.enabled).pullPolicy }}
          args: ["serve", {{ $name | quote }}]
          ports:
            - name: grpc
              containerPort: {{ $cfg.port }}
              protocol: TCP
            {{- if and $cfg.http $cfg.http.enabled }}
            # The HTTP/JSON gateway in the same process (docs/http-api.md).
            - name: http
              containerPort: {{ $cfg.http.port }}
              protocol: TCP
            {{- end }}
            {{- if $root.Values.metrics.enabled }}
            - name: metrics
              containerPort: {{ $root.Values.metrics.port }}
              protocol: TCP
            {{- end }}
          env:
            {{- include "attest.baseEnv" $root | nindent 12 }}
            {{- include "attest.threadsEnv" (dict "cfg" $cfg "processes" 1) | nindent 12 }}
            - name: {{ $prefix }}SERVER__PORT
              value: {{ $cfg.port | quote }}
            {{- with $cfg.http }}
            {{- if .enabled }}
            - name: {{ $prefix }}HTTP__PORT
              value: {{ .port | quote }}
            {{- else }}
            - name: {{ $prefix }}HTTP__ENABLED
              value: "false"
            {{- end }}
            {{- end }}
            {{- if $root.Values.metrics.enabled }}
            - name: {{ $prefix }}SERVER__METRICS_PORT
              value: {{ $root.Values.metrics.port | quote }}
            {{- end }}
            - name: {{ $prefix }}LOGGING__LEVEL
              value: {{ $root.Values.logging.level | quote }}
            - name: {{ $prefix }}LOGGING__JSON
              value: {{ $root.Values.logging.json | quote }}
            {{- if $dataVolume }}
            - name: ATTEST_DATA_DIR
              value: /var/lib/attest
            {{- end }}
            {{- range $peer := $peers }}
            - name: {{ printf "%s%s%s_ADDRESS" $prefix (upper ($cfg.peerSettingsPrefix | default "")) (upper $peer) }}
              value: {{ include "attest.peerAddress" (dict "root" $root "peer" $peer) | quote }}
            {{- end }}
            {{- range $key, $value := .env }}
            - name: {{ printf "%s%s" $prefix $key }}
              value: {{ $value | quote }}
            {{- end }}
            {{- range .secretEnv }}
            {{- include "attest.secretEnv" . | nindent 12 }}
            {{- end }}
            {{- with .redisPrefix }}
            {{- include "attest.redisEnv" (dict "root" $root "prefix" .) | nindent 12 }}
            {{- end }}
            {{- with (include "attest.securityEnv" $security | trim) }}{{ . | nindent 12 }}{{- end }}
            {{- include "attest.settingsEnv" (dict "prefix" $prefix "settings" $cfg.settings) | indent 12 }}
          # Native gRPC probes ask grpc.health.v1 for the server's overall
          # status, which turns SERVING only after every model and backend is warm.
          {{- $probe := dict "root" $root "port" $cfg.port "name" $full }}
          startupProbe:
            {{- include "attest.healthProbe" $probe | trim | nindent 12 }}
            periodSeconds: {{ $cfg.probes.periodSeconds }}
            failureThreshold: {{ $cfg.probes.startupFailureThreshold }}
          readinessProbe:
            {{- include "attest.healthProbe" $probe | trim | nindent 12 }}
            periodSeconds: 5
            failureThreshold: 2
          livenessProbe:
            {{- include "attest.healthProbe" $probe | trim | nindent 12 }}
            periodSeconds: {{ $cfg.probes.periodSeconds }}
            timeoutSeconds: 5
            failureThreshold: 3
          resources:
            {{- include "attest.resources" (dict "cfg" $cfg) | nindent 12 }}
          securityContext:
            {{- toYaml $root.Values.containerSecurityContext | nindent 12 }}
          volumeMounts:
            - name: tmp
              mountPath: /tmp
            {{- with (include "attest.securityMounts" $security | trim) }}{{ . | nindent 12 }}{{- end }}
            {{- if $dataVolume }}
            - name: data
              mountPath: /var/lib/attest
            {{- end }}
            {{- if $cfg.gpu.enabled }}
            - name: dshm
              mountPath: /dev/shm
            {{- end }}
            {{- with .volumeMounts }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
      volumes:
        - name: tmp
          emptyDir: {}
        {{- with (include "attest.securityVolumes" $security | trim) }}{{ . | nindent 8 }}{{- end }}
        {{- if $dataVolume }}
        - name: data
          persistentVolumeClaim:
            claimName: {{ $cfg.persistence.existingClaim | default (printf "%s-data" $full) }}
        {{- end }}
        {{- if $cfg.gpu.enabled }}
        - name: dshm
          emptyDir:
            medium: Memory
            sizeLimit: {{ $cfg.gpu.shmSize }}
        {{- end }}
        {{- with .volumes }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
---
# Headless: DNS returns every ready pod, so clients balance per call
# (round_robin in attest.core.channels) instead of pinning one connection.
apiVersion: v1
kind: Service
metadata:
  name: {{ $full }}
  labels:
    {{- include "attest.labels" $ctx | nindent 4 }}
spec:
  clusterIP: None
  selector:
    {{- include "attest.selectorLabels" $ctx | nindent 4 }}
  ports:
    - name: grpc
      port: {{ $cfg.port }}
      targetPort: grpc
      protocol: TCP
      appProtocol: grpc
    {{- if and $cfg.http $cfg.http.enabled }}
    - name: http
      port: {{ $cfg.http.port }}
      targetPort: http
      protocol: TCP
      appProtocol: http
    {{- end }}
{{- if $cfg.externalService.enabled }}
---
apiVersion: v1
kind: Service
metadata:
  name: {{ printf "%s-public" $full | trunc 63 | trimSuffix "-" }}
  labels:
    {{- include "attest.labels" $ctx | nindent 4 }}
  {{- with $cfg.externalService.annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  type: {{ $cfg.externalService.type }}
  selector:
    {{- include "attest.selectorLabels" $ctx | nindent 4 }}
  ports:
    - name: grpc
      port: {{ $cfg.externalService.port }}
      targetPort: grpc
      protocol: TCP
      appProtocol: grpc
    {{- if and $cfg.http $cfg.http.enabled }}
    - name: http
      port: {{ $cfg.externalService.httpPort | default $cfg.http.port }}
      targetPort: http
      protocol: TCP
      appProtocol: http
    {{- end }}
{{- end }}
{{- if and $cfg.persistence.enabled (not $cfg.persistence.existingClaim) }}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: {{ printf "%s-data" $full }}
  labels:
    {{- include "attest.labels" $ctx | nindent 4 }}
  annotations:
    helm.sh/resource-policy: keep
spec:
  accessModes: ["ReadWriteOnce"]
  {{- with $cfg.persistence.storageClass }}
  storageClassName: {{ . }}
  {{- end }}
  resources:
    requests:
      storage: {{ $cfg.persistence.size }}
{{- end }}
{{- if $cfg.autoscaling.enabled }}
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata:
  name: {{ $full }}
  labels:
    {{- include "attest.labels" $ctx | nindent 4 }}
spec:
  scaleTargetRef:
    apiVersion: apps/v1
    kind: Deployment
    name: {{ $full }}
  minReplicas: {{ $cfg.autoscaling.minReplicas }}
  maxReplicas: {{ $cfg.autoscaling.maxReplicas }}
  metrics:
    - type: Resource
      resource:
        name: cpu
        target:
          type: Utilization
          averageUtilization: {{ $cfg.autoscaling.targetCPUUtilizationPercentage }}
{{- end }}
{{- if $cfg.pdb.enabled }}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ $full }}
  labels:
    {{- include "attest.labels" $ctx | nindent 4 }}
spec:
  minAvailable: {{ $cfg.pdb.minAvailable }}
  selector:
    matchLabels:
      {{- include "attest.selectorLabels" $ctx | nindent 6 }}
{{- end }}
{{- if $root.Values.networkPolicy.enabled }}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: {{ $full }}
  labels:
    {{- include "attest.labels" $ctx | nindent 4 }}
spec:
  podSelector:
    matchLabels:
      {{- include "attest.selectorLabels" $ctx | nindent 6 }}
  policyTypes: [Ingress, Egress]
  ingress:
    {{- $callers := list }}
    {{- range $caller, $c := $root.Values.services }}
    {{- if and $c.enabled (has $name (include "attest.peers" (dict "root" $root "cfg" $c) | fromJsonArray)) }}
    {{- $callers = append $callers $caller }}
    {{- end }}
    {{- end }}
    {{- range $pool, $w := $root.Values.workers }}
    {{- if and $w.enabled (has $name (include "attest.peers" (dict "root" $root "cfg" $w) | fromJsonArray)) }}
    {{- $callers = append $callers (printf "worker-%s" $pool) }}
    {{- end }}
    {{- end }}
    {{- $clients := index ($root.Values.networkPolicy.clientsFrom | default dict) $name | default list }}
    {{- if or $callers $clients }}
    - ports:
        - port: grpc
          protocol: TCP
        {{- if and $cfg.http $cfg.http.enabled }}
        - port: http
          protocol: TCP
        {{- end }}
      from:
        {{- range $callers }}
        - podSelector:
            matchLabels:
              {{- include "attest.selectorLabels" (dict "root" $root "component" .) | nindent 14 }}
        {{- end }}
        {{- with $clients }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
    {{- end }}
    {{- if $root.Values.metrics.enabled }}
    - ports:
        - port: metrics
          protocol: TCP
      from:
        {{- toYaml $root.Values.networkPolicy.metricsFrom | nindent 8 }}
    {{- end }}
  egress:
    {{- include "attest.dnsEgress" . | nindent 4 }}
    {{- range $peer := $peers }}
    - ports:
        - port: {{ (index $root.Values.services $peer).port }}
          protocol: TCP
      to:
        - podSelector:
            matchLabels:
              {{- include "attest.selectorLabels" (dict "root" $root "component" $peer) | nindent 14 }}
    {{- end }}
    {{- range .backends }}
    {{- include "attest.backendEgress" (dict "root" $root "backend" .) | nindent 4 }}
    {{- end }}
    {{- with (include "attest.tracingEgress" $root) }}
    {{- . | nindent 4 }}
    {{- end }}
{{- end }}
{{- end -}}
{{- end -}}

{{- define "attest.dnsEgress" -}}
- ports:
    - port: 53
      protocol: UDP
    - port: 53
      protocol: TCP
{{- end -}}

{{/* Egress to one backend (lexical, qdrant, redis, llm); the in-chart TGI by label. */}}
{{- define "attest.backendEgress" -}}
{{- $root := .root -}}
{{- if and (eq .backend "llm") $root.Values.tgi.enabled -}}
- ports:
    - port: {{ $root.Values.tgi.port }}
      protocol: TCP
  to:
    - podSelector:
        matchLabels:
          {{- include "attest.selectorLabels" (dict "root" $root "component" "tgi") | nindent 10 }}
{{- else -}}
{{- $rule := index $root.Values.networkPolicy.backends .backend -}}
- ports:
    {{- toYaml $rule.ports | nindent 4 }}
  {{- with $rule.to }}
  to:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}
{{- end -}}

{{/*
Authentication, service identity and TLS of one process. Input: dict
  "root"     the chart context
  "prefix"   its settings prefix (ATTEST_ANSWER_, ATTEST_PIPELINE_)
  "server"   true for a gRPC service (it checks callers)
  "public"   true for answer and ingest (JWTs from end users)
  "caller"   true when it calls other services (it presents the service key)
  "identity" where the caller's identity lives: SERVER__IDENTITY__ or CLIENT__IDENTITY__
Secrets are mounted as folders (never subPath) so updates reach the pods.
*/}}
{{- define "attest.securityEnv" -}}
{{- $sec := .root.Values.security -}}
{{- $p := .prefix -}}
{{- if .server }}
{{- if $sec.apiKeys.existingSecret }}
- name: {{ $p }}SERVER__AUTH__KEYS_FILE
  value: {{ printf "/etc/attest/keys/%s" $sec.apiKeys.key | quote }}
{{- end }}
{{- if and .public $sec.jwt.jwksUrl }}
- name: {{ $p }}SERVER__AUTH__JWKS_URL
  value: {{ $sec.jwt.jwksUrl | quote }}
- name: {{ $p }}SERVER__AUTH__ISSUER
  value: {{ required "security.jwt.issuer is required with security.jwt.jwksUrl" $sec.jwt.issuer | quote }}
- name: {{ $p }}SERVER__AUTH__AUDIENCE
  value: {{ required "security.jwt.audience is required with security.jwt.jwksUrl" $sec.jwt.audience | quote }}
- name: {{ $p }}SERVER__AUTH__LEEWAY_SECONDS
  value: {{ $sec.jwt.leewaySeconds | quote }}
{{- end }}
{{- if $sec.tls.existingSecret }}
- name: {{ $p }}SERVER__TLS__CERT_FILE
  value: /etc/attest/tls/tls.crt
- name: {{ $p }}SERVER__TLS__KEY_FILE
  value: /etc/attest/tls/tls.key
{{- if and $sec.tls.mutual (not .public) }}
- name: {{ $p }}SERVER__TLS__CLIENT_CA_FILE
  value: /etc/attest/tls/ca.crt
- name: {{ $p }}SERVER__TLS__REQUIRE_CLIENT_CERT
  value: "true"
{{- end }}
{{- end }}
{{- end }}
{{- if .caller }}
{{- if $sec.serviceToken.existingSecret }}
{{ include "attest.secretEnv" (dict "name" (printf "%s%sTOKEN" $p .identity) "secret" $sec.serviceToken.existingSecret "key" $sec.serviceToken.key) }}
{{- end }}
{{- if $sec.tls.existingSecret }}
- name: {{ $p }}{{ .identity }}TLS__CA_FILE
  value: /etc/attest/tls/ca.crt
{{- if $sec.tls.mutual }}
- name: {{ $p }}{{ .identity }}TLS__CERT_FILE
  value: /etc/attest/tls/tls.crt
- name: {{ $p }}{{ .identity }}TLS__KEY_FILE
  value: /etc/attest/tls/tls.key
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Mounts of the secrets above: dict "root" "server" (bool). */}}
{{- define "attest.securityMounts" -}}
{{- $sec := .root.Values.security -}}
{{- if and .server $sec.apiKeys.existingSecret }}
- name: api-keys
  mountPath: /etc/attest/keys
  readOnly: true
{{- end }}
{{- if $sec.tls.existingSecret }}
- name: tls
  mountPath: /etc/attest/tls
  readOnly: true
{{- end }}
{{- end -}}

{{- define "attest.securityVolumes" -}}
{{- $sec := .root.Values.security -}}
{{- if and .server $sec.apiKeys.existingSecret }}
- name: api-keys
  secret:
    secretName: {{ $sec.apiKeys.existingSecret }}
    items:
      - key: {{ $sec.apiKeys.key }}
        path: {{ $sec.apiKeys.key }}
{{- end }}
{{- if $sec.tls.existingSecret }}
- name: tls
  secret:
    secretName: {{ $sec.tls.existingSecret }}
{{- end }}
{{- end -}}

{{/*
A probe of the gRPC health service: the kubelet's native gRPC probe in plain
text; with TLS (which the native probe cannot speak) the image's health check
over TLS, as the service's own name. Input: dict "root" "port" "name" (DNS name).
*/}}
{{- define "attest.healthProbe" -}}
{{- $sec := .root.Values.security -}}
{{- if $sec.tls.existingSecret }}
exec:
  command:
    - python
    - /app/healthcheck.py
    - {{ printf "127.0.0.1:%d" (int .port) | quote }}
    - --ca
    - /etc/attest/tls/ca.crt
    - --server-name
    - {{ .name | quote }}
    {{- if $sec.tls.mutual }}
    - --cert
    - /etc/attest/tls/tls.crt
    - --key
    - /etc/attest/tls/tls.key
    {{- end }}
{{- else }}
grpc:
  port: {{ .port }}
{{- end }}
{{- end -}}
