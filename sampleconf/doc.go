// Package sampleconf is the sampling vocabulary that the client-side sampler
// (clientlib/sampling) and the server-side backlog controller (service/sampling)
// share: what a traffic kind name may be and what a percentage may be.
//
// It imports only the standard library, so a server package can check a kind
// the way every client will without linking the client library (the server
// side never imports clientlib), and the two can never drift apart.
package sampleconf
