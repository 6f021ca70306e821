{{- define "gantry.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gantry.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "gantry.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "gantry.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "gantry.labels" -}}
app.kubernetes.io/name: {{ include "gantry.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "gantry.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gantry.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "gantry.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "gantry.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "gantry.mpsSelectorLabels" -}}
app.kubernetes.io/name: {{ include "gantry.name" . }}-mps-control-daemon
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The DRA plugin's pods: not matched by the device plugin's selector. */}}
{{- define "gantry.draSelectorLabels" -}}
app.kubernetes.io/name: {{ include "gantry.name" . }}-dra
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* A plugin's nodeSelector: its own, and with the node installer the
ready label it sets once the node's runtime is in place. Called with
(list $ SELECTOR); renders YAML (fromYaml reads it back). */}}
{{- define "gantry.nodeSelector" -}}
{{- $root := index . 0 -}}
{{- $sel := dict -}}
{{- with index . 1 }}{{- $sel = merge $sel . -}}{{- end -}}
{{- if $root.Values.installer.enabled -}}
{{- $_ := set $sel $root.Values.installer.readyLabel "true" -}}
{{- end -}}
{{- if $sel }}{{ toYaml $sel }}{{ end -}}
{{- end -}}

{{- define "gantry.installerSelectorLabels" -}}
app.kubernetes.io/name: {{ include "gantry.name" . }}-node-installer
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
