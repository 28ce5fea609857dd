{{- define "modelplex.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "modelplex.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "modelplex.readyProbe" -}}
{{- if eq .Values.probes.protocol "grpc" }}
grpc: {port: {{ .Values.ports.grpc }}, service: ""}
{{- else }}
httpGet: {path: /v2/health/ready, port: http}
{{- end }}
{{- end }}
