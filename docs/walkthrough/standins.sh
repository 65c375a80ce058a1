#!/bin/sh
# Local stand-ins for docs/walkthrough.md: an API server (kube-emulator), three
# simulated MI300X nodes and one agent per node, all on 127.0.0.1, all under $WALK.
# Needs what `cargo build --bins -p gpu-operator -p kube-emulator` builds, and kubectl.
#
#   sh docs/walkthrough/standins.sh up          # emulator, hosts, Nodes, bundles, agents
#   sh docs/walkthrough/standins.sh restart N   # "the host came back": agent N again, Node bootID
#   sh docs/walkthrough/standins.sh down        # stop everything it started (PIDs in $WALK/pids)
#
# Not a kubelet: nothing registers the device plugins, so the DeviceConfig stays
# READY=False ("not registered with the kubelet") and Nodes show no amd.com/gpu.
set -eu
REPO=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${BIN:-$REPO/target/debug}
WALK=${WALK:-/tmp/gpu-walk}
KUBECTL=${KUBECTL:-kubectl}
K=6.8.0-49-generic
export KUBECONFIG=$WALK/kubeconfig
mkdir -p "$WALK/pids" "$WALK/log"

agent() { # start node $1's agent as the DaemonSet would (env), with the stand-in tools
  n=$1 T=$WALK/tools/gpu-node-$1
  mkdir -p "$WALK/kubelet/gpu-node-$n/device-plugins" "/var/tmp/gpu-walk-rvs-$n"
  # fake-rvs.sh must announce its results under /var/tmp, where the agent reads rvs results.
  NODE_NAME=gpu-node-$n POD_NAME=gpu-operator-pod$n POD_NAMESPACE=kube-amd-gpu \
  GPU_OPERATOR_HOST_ROOT=$WALK/hosts/gpu-node-$n \
  KUBELET_DIR=$WALK/kubelet/gpu-node-$n FAKE_RVS_DIR=/var/tmp/gpu-walk-rvs-$n \
  nohup "$BIN/gpu-operator" agent --metrics-bind 127.0.0.1:500$n --modprobe "$T/modprobe" \
    --reboot-command "$T/reboot" --rvs "$REPO/tests/fixtures/testrunner/fake-rvs.sh" \
    --rvs-conf-dir "$T" >>"$WALK/log/agent-$n.log" 2>&1 &
  echo $! >"$WALK/pids/agent-$n"
}

node() { # the Node as its kubelet registers it; after a reboot, only its new boot id
  boot=$(cat "$WALK/hosts/$1/proc/sys/kernel/random/boot_id")
  if $KUBECTL get node "$1" >/dev/null 2>&1; then
    $KUBECTL patch node "$1" --subresource=status --type=merge -p "{\"status\":{\"nodeInfo\":{\"bootID\":\"$boot\"}}}"
    return
  fi
  printf '%s\n' "apiVersion: v1" "kind: Node" "metadata: {name: $1, labels: {kubernetes.io/hostname: $1, feature.node.kubernetes.io/amd-gpu: \"true\"}}" \
    "status: {conditions: [{type: Ready, status: \"True\", reason: KubeletReady}], nodeInfo: {bootID: \"$boot\", kernelVersion: $K, machineID: '', systemUUID: '', osImage: Ubuntu, containerRuntimeVersion: 'containerd://2.0', kubeletVersion: v1.34.0, kubeProxyVersion: '', operatingSystem: linux, architecture: amd64}}" \
    | $KUBECTL create -f -
}

case ${1:-} in
up)
  nohup "$BIN/kube-emulator" --port 0 --kubeconfig "$KUBECONFIG" >"$WALK/log/emulator.log" 2>&1 &
  echo $! >"$WALK/pids/emulator"; sleep 2
  for v in 6.13.0 6.14.1 6.14.2; do # three driver bundles (docs/driver.md "Making a bundle"), as tarballs
    B=$WALK/bundles/$v-$K; mkdir -p "$B/lib/modules/$K/updates/dkms" "$B/firmware/amdgpu"
    for m in amdgpu amdttm; do printf '\177ELF %s %s' $m $v >"$B/lib/modules/$K/updates/dkms/$m.ko"; done
    printf 'updates/dkms/amdgpu.ko: updates/dkms/amdttm.ko\nupdates/dkms/amdttm.ko:\n' >"$B/lib/modules/$K/modules.dep"
    echo fw >"$B/firmware/amdgpu/psp_13_0_6_sos.bin"
    "$BIN/gpu-operator" driver manifest --bundle-dir "$B" --kernel $K --version $v
    tar -C "$WALK/bundles" -czf "$WALK/bundles/amdgpu-$v.tar.gz" "$v-$K"
  done
  for n in 1 2 3; do
    H=$WALK/hosts/gpu-node-$n T=$WALK/tools/gpu-node-$n
    "$BIN/gpu-operator" simulate --profile mi300x --out "$H"
    printf '3f1c2a9e-5b7d-4e08-9c61-2d4f8a0b7e1%s\n' $n >"$H/proc/sys/kernel/random/boot_id"
    mkdir -p "$H/tmp" "$T"; touch "$T/gst_single.conf"
    for v in 6.13.0 6.14.1 6.14.2; do # the bundle store, filled as an init container would
      cp "$WALK/bundles/amdgpu-$v.tar.gz" "$H/tmp/"
      "$BIN/gpu-operator" driver fetch --host-root "$H" --source /tmp/amdgpu-$v.tar.gz \
        --sha256 "$(sha256sum "$H/tmp/amdgpu-$v.tar.gz" | cut -d' ' -f1)"
    done
    # modprobe: load = show the bundle's version in sys/module/amdgpu; -r = remove it.
    printf '%s\n' '#!/bin/sh' "m=$H/sys/module/amdgpu; echo \"\$*\" >>$T/modprobe.log" \
      'if [ "$1" = -r ]; then rm -rf "$m"; exit 0; fi' \
      'v=$(sed -n "s/.*\"version\" *: *\"\([^\"]*\)\".*/\1/p" "$2/manifest.json")' \
      'mkdir -p "$m"; echo "$v" >"$m/version"; echo O >"$m/taint"; echo 0 >"$m/refcnt"; echo live >"$m/initstate"' \
      'echo "SRC$v" | tr -d . >"$m/srcversion"' >"$T/modprobe"
    # reboot: new boot id, fresh RAS counters, no amdgpu, and the agent (its parent) stopped,
    # as a reboot stops it; `standins.sh restart N` is the host coming back.
    printf '%s\n' '#!/bin/sh' "H=$H; n=\$(cat $T/reboot.log 2>/dev/null | wc -l)" \
      'printf "b007%08d-0000-4000-8000-00000000000'$n'\n" "$n" >$H/proc/sys/kernel/random/boot_id' \
      'for f in $H/sys/bus/pci/devices/*/ras/*_err_count; do printf "ue: 0\nce: 0\n" >$f.new; mv $f.new $f; done' \
      "rm -rf \$H/sys/module/amdgpu; date +%T >>$T/reboot.log; kill \$PPID" >"$T/reboot"
    chmod +x "$T/modprobe" "$T/reboot"
    node gpu-node-$n; agent $n
  done ;;
restart) kill "$(cat "$WALK/pids/agent-$2")" 2>/dev/null || true; sleep 1; node "gpu-node-$2"; agent "$2" ;;
down) for p in "$WALK"/pids/agent-* "$WALK/pids/emulator"; do kill "$(cat "$p")" 2>/dev/null || true; done ;;
*) sed -n '2,11p' "$0"; exit 2 ;;
esac
