#!/usr/bin/env bash
# Debian packages for the live cluster tests (tests/cluster/): a real single-host Slurm cluster (munge,
# slurmctld, slurmd and the client commands) and, for DeepSpeed's multi-node launch, an OpenSSH server and pdsh;
# iproute2 (ip netns, tc) and nftables (packet loss) for the multi-host tests' virtual network.
# The tests start and stop the daemons themselves; this script only installs. Idempotent and quiet: when
# everything is installed it returns at once, and the package lists are refreshed only when something is missing.
set -euo pipefail

PACKAGES=(munge slurmctld slurmd slurm-client openssh-server openssh-client pdsh iproute2 nftables)

missing=()
for package in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed' || missing+=("$package")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" != 0 ]; then
  # Not fatal here: the rest of the suite runs, and the live tests say what is missing (failing when CI=true).
  echo "test_services.sh: not root, so ${missing[*]} cannot be installed; the live cluster tests will not run" \
       "(install them with: sudo apt-get install --no-install-recommends ${missing[*]})" >&2
  exit 0
fi

export DEBIAN_FRONTEND=noninteractive
# The packages' install scripts would start sshd, munged and the Slurm daemons as system services; the tests
# run their own instances, so forbid service starts for the duration (Debian's policy-rc.d protocol, exit 101)
# unless the machine already has a policy.
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' > "$policy"
  chmod 755 "$policy"
  trap 'rm -f "$policy"' EXIT
fi
echo "test_services.sh: installing ${missing[*]}"
# --no-install-recommends: Slurm's recommends pull in dozens of plugin libraries the tests do not use.
# apt's chatter is shown only when it fails.
if ! log=$( { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"; } 2>&1 ); then
  echo "$log" >&2
  echo "test_services.sh: installing ${missing[*]} failed (see above)" >&2
  exit 1
fi
