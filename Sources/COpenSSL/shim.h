#ifndef TETHER_COPENSSL_SHIM_H
#define TETHER_COPENSSL_SHIM_H
#include <openssl/ssl.h>
#include <openssl/err.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <openssl/pem.h>
#include <openssl/evp.h>
#include <openssl/bio.h>

// OpenSSL exposes these as macros over SSL_ctrl / BIO_ctrl; Swift cannot
// import function-like macros.
static inline int tether_ssl_ctx_set_min_proto_version(SSL_CTX *ctx, int version) {
    return (int)SSL_CTX_set_min_proto_version(ctx, version);
}
static inline int tether_ssl_set_tlsext_host_name(SSL *ssl, const char *name) {
    return (int)SSL_set_tlsext_host_name(ssl, name);
}
static inline long tether_bio_pending(BIO *bio) { return (long)BIO_ctrl_pending(bio); }
static inline int tether_bio_set_mem_eof_return(BIO *bio, int v) { return (int)BIO_set_mem_eof_return(bio, v); }
#endif
