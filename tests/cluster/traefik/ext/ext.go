// Package ext is the extension point that Traefik's dynamic configuration embeds in its
// HTTP configuration and routers (github.com/traefik/traefik/dynamic/ext). Traefik's own
// build fills it from a nested module of its repository, which a module download of
// github.com/traefik/traefik/v3 does not contain and no registry serves, so the wrapper
// module replaces it with this one. The open-source build's extension carries no fields:
// empty types, and a RouterIng that converts to an empty Router.
package ext

// HTTP extends dynamic.HTTP.
type HTTP struct{}

// Router extends dynamic.Router.
type Router struct{}

// RouterIng extends the routers the Ingress provider builds from annotations.
type RouterIng struct{}

// ToRouter gives the Router extension of an Ingress router.
func (RouterIng) ToRouter() Router { return Router{} }
