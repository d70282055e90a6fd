# consul-template: render the catalogue's services to a staging file, then
# hostmesh-apply-dropin checks the configuration with it and moves it into
# place (never a file `hostmesh check` rejects). docs/fleet.md.
template {
  source      = "/etc/consul-template/hostmesh.ctmpl"
  destination = "/var/lib/hostmesh-render/50-consul.toml"
  perms       = 0644
  command     = "/usr/local/sbin/hostmesh-apply-dropin /var/lib/hostmesh-render/50-consul.toml"
}
