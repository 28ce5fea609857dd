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

{{/* The Secret holding the admin token, or "" when the server runs without one. */}}
{{- define "modelplex.adminSecret" -}}
{{- if .Values.admin.existingSecret }}{{ .Values.admin.existingSecret }}
{{- else if .Values.admin.createSecret }}{{ .Release.Name }}-admin
{{- end }}
{{- end }}

{{/* The claim mounted as the model repository, or "" when modelRepository.volume is used. */}}
{{- define "modelplex.modelsClaim" -}}
{{- if not .Values.modelRepository.volume }}
{{- if .Values.modelRepository.existingClaim }}{{ .Values.modelRepository.existingClaim }}
{{- else if .Values.modelRepository.persistence.create }}{{ .Release.Name }}-models
{{- end }}
{{- end }}
{{- end }}

{{- define "modelplex.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}{{ default .Release.Name .Values.serviceAccount.name }}
{{- else }}{{ default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}
