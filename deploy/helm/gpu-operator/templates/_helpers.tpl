{{/*
Helpers of the gpu-operator chart.

Most objects are not written here: they are read from files/, byte-identical
copies of the plain manifests in deploy/ (tests/helm_chart.rs fails when they
differ; deploy/helm/sync-files copies them), so that `kubectl apply -f
deploy/` and `helm install` create the same RBAC, admission policies,
NetworkPolicy and DaemonSets. The chart only changes what its values say,
puts everything in the release namespace, and adds Helm's labels.
*/}}

{{/* The labels Helm's own tooling expects on every object of the release. */}}
{{- define "gpu-operator.helmLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{/*
The objects of one file of files/, as a YAML list (read it back with
fromYamlArray): every document that has a kind, with the namespace the
manifests are written for (kube-amd-gpu) replaced by the release namespace
wherever it appears (metadata, binding subjects, the ServiceAccount names
the admission policies match, the Lease the leader policy reads) and Helm's
labels added. Arguments: (list $ "files/NAME.yaml").
*/}}
{{- define "gpu-operator.fileObjects" -}}
{{- $ := index . 0 -}}
{{- $path := index . 1 -}}
{{- $text := $.Files.Get $path -}}
{{- if not $text -}}
{{- fail (printf "the chart has no %s: run deploy/helm/sync-files" $path) -}}
{{- end -}}
{{- $text = replace "kube-amd-gpu" $.Release.Namespace $text -}}
{{- $labels := include "gpu-operator.helmLabels" $ | fromYaml -}}
{{- $objects := list -}}
{{- range regexSplit "(?m)^---[ \\t]*$" $text -1 -}}
{{- $doc := fromYaml . -}}
{{- if hasKey $doc "Error" -}}
{{- fail (printf "%s: %s" $path $doc.Error) -}}
{{- end -}}
{{- if $doc.kind -}}
{{- $meta := $doc.metadata -}}
{{- $_ := set $meta "labels" (merge (dict) ($meta.labels | default dict) $labels) -}}
{{- $objects = append $objects $doc -}}
{{- end -}}
{{- end -}}
{{- toYaml $objects -}}
{{- end }}

{{/* The first object of a list of objects with this kind and name. */}}
{{- define "gpu-operator.find" -}}
{{- $objects := index . 0 -}}
{{- $kind := index . 1 -}}
{{- $name := index . 2 -}}
{{- range $objects -}}
{{- if and (eq .kind $kind) (eq .metadata.name $name) -}}
{{- toYaml . -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/*
Whether controllerManager.manager.image names AMD's controller image, which
is not this operator (a values file written for AMD's chart): then it is
ignored, and NOTES.txt says so. "true" or "".
*/}}
{{- define "gpu-operator.referenceImage" -}}
{{- $repository := .Values.controllerManager.manager.image.repository | default "" -}}
{{- if regexMatch "(^|/)rocm/amd-gpu-operator$" $repository -}}true{{- end -}}
{{- end }}

{{/* The image of the agents, node detection and the hook Jobs. */}}
{{- define "gpu-operator.image" -}}
{{- $image := .Values.controllerManager.manager.image -}}
{{- if include "gpu-operator.referenceImage" . -}}
{{- printf "gpu-operator:%s" .Chart.AppVersion -}}
{{- else -}}
{{- $reference := printf "%s:%s" ($image.repository | default "gpu-operator") ($image.tag | default .Chart.AppVersion) -}}
{{- if $image.digest -}}
{{- $reference = printf "%s@%s" $reference $image.digest -}}
{{- end -}}
{{- $reference -}}
{{- end -}}
{{- end }}

{{/* imagePullSecrets of every pod of the chart, as a YAML list ([] for none). */}}
{{- define "gpu-operator.imagePullSecrets" -}}
{{- $secrets := list -}}
{{- range .Values.global.imagePullSecrets -}}
{{- $secrets = append $secrets (dict "name" .name) -}}
{{- end -}}
{{- with .Values.controllerManager.manager.imagePullSecrets -}}
{{- $secrets = append $secrets (dict "name" .) -}}
{{- end -}}
{{- toYaml $secrets -}}
{{- end }}

{{/*
The annotations of the agents' ServiceAccount: controllerManager's and the
reference's per-operand ones, merged (the agent is all of those operands).
The same key with two values is an error, not a silent choice.
*/}}
{{- define "gpu-operator.serviceAccountAnnotations" -}}
{{- $merged := dict -}}
{{- $from := dict -}}
{{- range $key := list "controllerManager" "nodeLabeller" "metricsExporter" "testRunner" "configManager" "utilsContainer" "draDriver" -}}
{{- $section := index $.Values $key | default dict -}}
{{- $account := $section.serviceAccount | default dict -}}
{{- range $name, $value := $account.annotations | default dict -}}
{{- if and (hasKey $merged $name) (ne (toString (index $merged $name)) (toString $value)) -}}
{{- fail (printf "ServiceAccount annotation %s is %q in %s.serviceAccount.annotations and %q in %s.serviceAccount.annotations: the agent has one ServiceAccount, give it one value" $name (toString (index $merged $name)) (index $from $name) (toString $value) $key) -}}
{{- end -}}
{{- $_ := set $merged $name (toString $value) -}}
{{- $_ := set $from $name $key -}}
{{- end -}}
{{- end -}}
{{- toYaml $merged -}}
{{- end }}

{{/* The pod spec fields every hook Job shares: any Linux node, GPU nodes tainted amd.com/gpu included. */}}
{{- define "gpu-operator.hookPodSpec" -}}
{{- $secrets := include "gpu-operator.imagePullSecrets" . | fromYamlArray -}}
restartPolicy: Never
nodeSelector:
  {{- toYaml (merge (dict "kubernetes.io/os" "linux") (.Values.controllerManager.manager.nodeSelector | default dict)) | nindent 2 }}
tolerations:
  - key: amd.com/gpu
    operator: Exists
  {{- with .Values.controllerManager.manager.tolerations }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with $secrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  # The image's own non-root user (Dockerfile): the hooks only talk to the
  # API server.
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  seccompProfile:
    type: RuntimeDefault
{{- end }}

{{/* The container fields every hook Job shares. */}}
{{- define "gpu-operator.hookContainer" -}}
image: {{ include "gpu-operator.image" . }}
imagePullPolicy: {{ .Values.controllerManager.manager.imagePullPolicy }}
env:
  - name: POD_NAMESPACE
    valueFrom:
      fieldRef:
        fieldPath: metadata.namespace
resources:
  requests:
    cpu: 10m
    memory: 16Mi
  limits:
    memory: 64Mi
securityContext:
  privileged: false
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities:
    drop: ["ALL"]
{{- end }}

{{/*
deviceConfig.spec as AMD's chart writes it into the DeviceConfig: a field
that is null, "", [] or {} in the values is left out (its template writes
each field only `with` a value), so that a values file full of empty
placeholders (imageRegistrySecret: {}, configMapImage: "") makes a
DeviceConfig the CRD accepts. A section with fields stays, even if all of
them are left out: a present driver or devicePlugin section means "on".
Label-like maps (selector, annotations, arguments) are kept as written,
where "" can be a value. Lists are kept as written.
*/}}
{{- define "gpu-operator.pruneSpec" -}}
{{- $out := dict -}}
{{- range $key, $value := . -}}
{{- if kindIs "map" $value -}}
{{- if $value -}}
{{- if has $key (list "selector" "labels" "annotations" "podAnnotations" "serviceAnnotations" "nodeRemediationLabels" "devicePluginArguments" "cmdLineArguments" "attachMetadata") -}}
{{- $_ := set $out $key $value -}}
{{- else -}}
{{- $_ := set $out $key (include "gpu-operator.pruneSpec" $value | fromYaml) -}}
{{- end -}}
{{- end -}}
{{- else if or (kindIs "slice" $value) (kindIs "string" $value) -}}
{{- if $value -}}
{{- $_ := set $out $key $value -}}
{{- end -}}
{{- else if not (kindIs "invalid" $value) -}}
{{- $_ := set $out $key $value -}}
{{- end -}}
{{- end -}}
{{- toYaml $out -}}
{{- end }}

{{/*
"true" when the cluster runs node-feature-discovery (it serves
NodeFeatureRules), else "false". Decides between NFD's rule and node
detection; `helm template` without a cluster says so with
--api-versions nfd.k8s-sigs.io/v1alpha1/NodeFeatureRule.
*/}}
{{- define "gpu-operator.nfdServed" -}}
{{- .Capabilities.APIVersions.Has "nfd.k8s-sigs.io/v1alpha1/NodeFeatureRule" -}}
{{- end }}
