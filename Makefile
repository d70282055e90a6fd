# Shorthands for the scripts (every target runs as root on Debian 12).
.PHONY: demo test test-kernels deb rpm packages acceptance fuzz scale

demo:
	./scripts/demo

test:
	./scripts/test

# The integration suite in VMs with Debian's 6.1, 6.12 and 5.10 kernels
# (15-20 minutes each under software emulation).
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
