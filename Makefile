# Shorthands for the scripts (every target runs as root on Debian 12).
.PHONY: demo test test-kernels deb rpm packages acceptance fuzz scale upgrade

demo:
	./scripts/demo

# The whole suite (about 20 minutes on 2 CPUs; it prints its wall time).
test:
	./scripts/test

# The integration suite on this kernel and in VMs with Debian's 6.1, 6.12
# and 5.10 kernels (about 10, 9 and 16 minutes each under software
# emulation on 2 CPUs, Dec 2026).
test-kernels:
	./scripts/test-kernels

deb:
	packaging/deb/build

rpm:
	packaging/rpm/build

packages: deb rpm

# Builds both packages, checks them, and tests them under a real systemd in
# systemd-nspawn and (the .deb) on a Debian 12 VM with its own kernel (a few
# minutes the first time: the Debian roots are cached).
acceptance:
	./scripts/acceptance

# The loader's property tests with 1,000,000 cases each (a few minutes).
fuzz:
	./bench/fuzz

# The control plane at 1,000 to 60,000 services (about a minute).
scale:
	./bench/scale

# An upgrade in place from an older commit (default 548fe99): builds it
# (a few minutes the first time), then replaces it under traffic.
upgrade:
	./bench/upgrade
