{{/*
The release's name for its objects: RELEASE-onceflow, or RELEASE when it
already says onceflow.
*/}}
{{- define "onceflow.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "onceflow.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: onceflow
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{/* The labels that select one component's pods: (dict "root" $ "name" "relay"). */}}
{{- define "onceflow.selector" -}}
app.kubernetes.io/name: onceflow
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .name }}
{{- end -}}

{{- define "onceflow.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ $tag }}
{{- end -}}
{{- end -}}

{{/*
The settings onceflow holds secret: each is given as a file (NAME_FILE), a
key of a Secret mounted under /etc/onceflow/secrets, never as a value.
*/}}
{{- define "onceflow.secretSettings" -}}
DATABASE_URL DATABASE_MIGRATION_URL KAFKA_SASL_PASSWORD SCHEMA_REGISTRY_URL SCHEMA_REGISTRY_PASSWORD ONCEFLOW_ADMIN_TOKEN ONCEFLOW_NATS_URL ONCEFLOW_DEV_API_KEY
{{- end -}}

{{/* refuseSecrets fails when a map of settings (env) names a secret one. */}}
{{- define "onceflow.refuseSecrets" -}}
{{- $secret := splitList " " (include "onceflow.secretSettings" .root) -}}
{{- range $k, $v := .env -}}
{{- if has $k $secret -}}
{{- fail (printf "%s: %s is a secret: give it as a Secret (values.yaml says where), not in env" $.where $k) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
What each container reads, by the name of its command (its -h):
the admin server, Kafka, the schema registry, Postgres, a pool size, the
logger. The Job's two commands are migrate (Postgres only) and topics
(Kafka only); the lag exporter serves on -serve's address.
*/}}
{{- define "onceflow.uses" -}}
{{- $all := dict "admin" true "kafka" true "registry" true "postgres" true "pool" true "logging" true -}}
{{- $uses := dict
  "ingest" $all
  "relay" $all
  "processor" (dict "admin" true "kafka" true "registry" true "logging" true)
  "projector" $all
  "worker" (dict "admin" true "postgres" true "pool" true "logging" true)
  "lag" (dict "kafka" true "postgres" true "logging" true)
  "migrate" (dict "postgres" true)
  "topics" (dict "kafka" true) -}}
{{- toYaml (get $uses .) -}}
{{- end -}}

{{/*
The settings a component reads, as name: value (the secret ones as
NAME_FILE: path): (dict "root" $ "name" "relay"). topics is the migrate
Job's second container, as the Job's Kafka user.
*/}}
{{- define "onceflow.settings" -}}
{{- $v := .root.Values -}}
{{- $uses := include "onceflow.uses" .name | fromYaml -}}
{{- $c := get $v (ternary "migrate" .name (eq .name "topics")) -}}
{{- $env := dict -}}
{{- if $uses.logging -}}
{{- $_ := set $env "LOG_LEVEL" $v.logLevel -}}
{{- $_ := set $env "LOG_FORMAT" $v.logFormat -}}
{{- end -}}
{{- if $uses.admin -}}
{{- $_ := set $env "ADMIN_ADDR" ":9090" -}}
{{- end -}}
{{- if $uses.registry -}}
{{- $_ := set $env "SCHEMA_REGISTRY_URL_FILE" "/etc/onceflow/secrets/registry-url" -}}
{{- if $v.schemaRegistry.user -}}
{{- $_ := set $env "SCHEMA_REGISTRY_USER" $v.schemaRegistry.user -}}
{{- end -}}
{{- if $v.schemaRegistry.passwordSecret.name -}}
{{- $_ := set $env "SCHEMA_REGISTRY_PASSWORD_FILE" "/etc/onceflow/secrets/registry-password" -}}
{{- end -}}
{{- if $v.schemaRegistry.caSecret.name -}}
{{- $_ := set $env "SCHEMA_REGISTRY_CA_FILE" "/etc/onceflow/secrets/registry-ca.crt" -}}
{{- end -}}
{{- end -}}
{{- if $uses.kafka -}}
{{- $_ := set $env "KAFKA_BROKERS" $v.kafka.brokers -}}
{{- $_ := set $env "ONCEFLOW_TOPIC_PREFIX" $v.topicPrefix -}}
{{- if $v.kafka.tls.enabled -}}
{{- $_ := set $env "KAFKA_TLS" "true" -}}
{{- if $v.kafka.tls.caSecret.name -}}
{{- $_ := set $env "KAFKA_TLS_CA_FILE" "/etc/onceflow/secrets/kafka-ca.crt" -}}
{{- end -}}
{{- end -}}
{{- if $v.kafka.sasl.mechanism -}}
{{- $_ := set $env "KAFKA_SASL_MECHANISM" $v.kafka.sasl.mechanism -}}
{{- $_ := set $env "KAFKA_SASL_USER" $c.kafkaUser -}}
{{- $_ := set $env "KAFKA_SASL_PASSWORD_FILE" "/etc/onceflow/secrets/kafka-password" -}}
{{- if $v.kafka.sasl.allowPlaintext -}}
{{- $_ := set $env "KAFKA_ALLOW_PLAINTEXT_SASL" "true" -}}
{{- end -}}
{{- end -}}
{{- if and $v.lag.enabled $uses.admin -}}
{{- $_ := set $env "ONCEFLOW_LAG_EXPORT" "off" -}}
{{- end -}}
{{- end -}}
{{- if $uses.postgres -}}
{{- $_ := set $env "DATABASE_URL_FILE" "/etc/onceflow/secrets/database-url" -}}
{{- end -}}
{{- if $uses.pool -}}
{{- $_ := set $env "DATABASE_MAX_CONNS" (toString $v.postgres.maxConns) -}}
{{- end -}}
{{- if or (eq .name "ingest") (eq .name "relay") -}}
{{- $_ := set $env "ONCEFLOW_OUTBOX_SHARDS" (toString $v.outboxShards) -}}
{{- end -}}
{{- if eq .name "migrate" -}}
{{- $_ := set $env "DATABASE_MIGRATION_URL_FILE" "/etc/onceflow/secrets/database-migration-url" -}}
{{- end -}}
{{- if eq .name "topics" -}}
{{- $_ := set $env "ONCEFLOW_PARTITIONS" (toString $v.partitions) -}}
{{- end -}}
{{- if eq .name "ingest" -}}
{{- $_ := set $env "HTTP_ADDR" (printf ":%v" $c.service.port) -}}
{{- if $c.trustedProxies -}}
{{- $_ := set $env "ONCEFLOW_TRUSTED_PROXIES" $c.trustedProxies -}}
{{- end -}}
{{- end -}}
{{- if and (eq .name "worker") $v.networkPolicy.allowNetworks -}}
{{- $_ := set $env "ONCEFLOW_WEBHOOK_ALLOW_NETWORKS" (join "," $v.networkPolicy.allowNetworks) -}}
{{- end -}}
{{- if has .name $v.adminToken.components -}}
{{- $_ := set $env "ONCEFLOW_ADMIN_TOKEN_FILE" "/etc/onceflow/secrets/admin-token" -}}
{{- end -}}
{{- include "onceflow.refuseSecrets" (dict "root" .root "env" $v.env "where" "env") -}}
{{- if $uses.admin -}}
{{- range $k, $val := $v.env -}}
{{- $_ := set $env $k (toString $val) -}}
{{- end -}}
{{- end -}}
{{- if $c.env -}}
{{- include "onceflow.refuseSecrets" (dict "root" .root "env" $c.env "where" (printf "%s.env" .name)) -}}
{{- range $k, $val := $c.env -}}
{{- $_ := set $env $k (toString $val) -}}
{{- end -}}
{{- end -}}
{{- toYaml $env -}}
{{- end -}}

{{/*
The secrets a component mounts, as file name: {name, key} of a Secret:
only the ones it reads, so each mounts only its own Kafka password.
*/}}
{{- define "onceflow.secretFiles" -}}
{{- $v := .root.Values -}}
{{- $uses := include "onceflow.uses" .name | fromYaml -}}
{{- $files := dict -}}
{{- if $uses.postgres -}}
{{- $_ := set $files "database-url" $v.postgres.urlSecret -}}
{{- if $v.postgres.caSecret.name -}}
{{- $_ := set $files "postgres-ca.crt" $v.postgres.caSecret -}}
{{- end -}}
{{- end -}}
{{- if eq .name "migrate" -}}
{{- $_ := set $files "database-migration-url" $v.migrate.migrationUrlSecret -}}
{{- end -}}
{{- if $uses.registry -}}
{{- $_ := set $files "registry-url" $v.schemaRegistry.urlSecret -}}
{{- if $v.schemaRegistry.passwordSecret.name -}}
{{- $_ := set $files "registry-password" $v.schemaRegistry.passwordSecret -}}
{{- end -}}
{{- if $v.schemaRegistry.caSecret.name -}}
{{- $_ := set $files "registry-ca.crt" $v.schemaRegistry.caSecret -}}
{{- end -}}
{{- end -}}
{{- if or $uses.kafka (eq .name "migrate") -}}
{{- if and $v.kafka.tls.enabled $v.kafka.tls.caSecret.name -}}
{{- $_ := set $files "kafka-ca.crt" $v.kafka.tls.caSecret -}}
{{- end -}}
{{- if $v.kafka.sasl.mechanism -}}
{{- if not $v.kafka.sasl.passwordsSecret -}}
{{- fail "kafka.sasl.passwordsSecret: name the Secret of the components' Kafka passwords" -}}
{{- end -}}
{{- $_ := set $files "kafka-password" (dict "name" $v.kafka.sasl.passwordsSecret "key" (get $v .name).kafkaUser) -}}
{{- end -}}
{{- end -}}
{{- if has .name $v.adminToken.components -}}
{{- if not $v.adminToken.secret.name -}}
{{- fail "adminToken.secret.name: name the Secret of the admin token" -}}
{{- end -}}
{{- $_ := set $files "admin-token" $v.adminToken.secret -}}
{{- end -}}
{{- toYaml $files -}}
{{- end -}}

{{/* The container's env: (dict "root" $ "name" "relay" "identity" true). */}}
{{- define "onceflow.env" -}}
{{- $env := include "onceflow.settings" . | fromYaml -}}
env:
{{- if .identity }}
  # The instance id is the pod's name, NAME-ORDINAL: the same after a
  # restart or a reschedule, unique among the StatefulSet's pods.
  - name: ONCEFLOW_INSTANCE_ID
    valueFrom:
      fieldRef: {fieldPath: metadata.name}
{{- end }}
{{- range $k := keys $env | sortAlpha }}
  - name: {{ $k }}
    value: {{ get $env $k | quote }}
{{- end }}
{{- end -}}

{{/* The volumes of a component's pod: its secrets as files, and /tmp. */}}
{{- define "onceflow.volumes" -}}
{{- $files := include "onceflow.secretFiles" . | fromYaml -}}
volumes:
  - name: tmp
    emptyDir: {}
  - name: secrets
    projected:
      defaultMode: 0440
      sources:
{{- range $file := keys $files | sortAlpha }}
{{- $s := get $files $file }}
        - secret:
            name: {{ $s.name }}
            items: [{key: {{ $s.key | quote }}, path: {{ $file }}}]
{{- end }}
{{- end -}}

{{- define "onceflow.volumeMounts" -}}
volumeMounts:
  - {name: tmp, mountPath: /tmp}
  - {name: secrets, mountPath: /etc/onceflow/secrets, readOnly: true}
{{- end -}}

{{- define "onceflow.probes" -}}
readinessProbe:
  httpGet: {path: /readyz, port: admin}
  periodSeconds: 5
  failureThreshold: 3
livenessProbe:
  httpGet: {path: /healthz, port: admin}
  initialDelaySeconds: 10
  periodSeconds: 10
  failureThreshold: 6
{{- end -}}

{{/*
The pod template of a long-running component: (dict "root" $ "name"
"relay" "command" (list "relay") "identity" true).
*/}}
{{- define "onceflow.podTemplate" -}}
{{- $v := .root.Values -}}
{{- $c := get $v .name -}}
metadata:
  labels:
    {{- include "onceflow.labels" .root | nindent 4 }}
    {{- include "onceflow.selector" . | nindent 4 }}
  annotations:
    # A change of the settings rolls the pods.
    checksum/settings: {{ include "onceflow.settings" . | sha256sum }}
spec:
  terminationGracePeriodSeconds: {{ $v.terminationGracePeriodSeconds }}
  automountServiceAccountToken: false
  enableServiceLinks: false
  {{- with $v.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml $v.podSecurityContext | nindent 4 }}
  {{- with $v.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $v.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $v.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  containers:
    - name: {{ .name }}
      image: {{ include "onceflow.image" .root }}
      imagePullPolicy: {{ $v.image.pullPolicy }}
      command: {{ toJson .command }}
      {{- include "onceflow.env" . | nindent 6 }}
      ports:
        - {name: admin, containerPort: 9090}
        {{- if eq .name "ingest" }}
        - {name: http, containerPort: {{ $c.service.port }}}
        {{- end }}
      {{- include "onceflow.probes" . | nindent 6 }}
      resources:
        {{- toYaml $c.resources | nindent 8 }}
      securityContext:
        {{- toYaml $v.securityContext | nindent 8 }}
      {{- include "onceflow.volumeMounts" . | nindent 6 }}
  {{- include "onceflow.volumes" . | nindent 2 }}
{{- end -}}
