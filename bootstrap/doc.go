// Package bootstrap joins a worker to its job: Config and EnvConfig (the
// launcher's environment, every setting of the data plane included), Join
// (the NATS connection, the rendezvous that gives every rank the roster, the
// choice and setup of the data transport, the World), and the NATS control
// plane the World runs on (heartbeats, failure notices, abort). With
// natsconn it is the only package of a worker that imports the NATS client:
// the nats data transport gets the connection through transport.NATS.
package bootstrap
