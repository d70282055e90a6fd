# Shorthands for the scripts (every target runs as root on Debian 12).
.PHONY: demo test deb rpm packages acceptance

demo:
	./scripts/demo

test:
	./scripts/test

deb:
	packaging/deb/build

rpm:
	packaging/rpm/build

packages: deb rpm

# Builds both packages, checks them, and tests them under a real systemd in
# systemd-nspawn (a few minutes the first time: the Debian root is cached).
acceptance:
	./scripts/acceptance
