#ifndef TETHER_COPENSSL_SHIM_H
#define TETHER_COPENSSL_SHIM_H
#include <openssl/ssl.h>
#include <openssl/err.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <openssl/pem.h>
#include <openssl/evp.h>
#include <openssl/bio.h>
#include <openssl/rand.h>

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

// Used by TetherSync's TLS transport and certificate tools.
static inline long tether_ssl_ctx_add1_chain_cert(SSL_CTX *ctx, X509 *cert) {
    return SSL_CTX_add1_chain_cert(ctx, cert);
}
static inline long tether_ssl_ctx_disable_session_cache(SSL_CTX *ctx) {
    return SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
}
static inline int tether_err_get_lib(unsigned long e) { return ERR_GET_LIB(e); }
static inline int tether_err_get_reason(unsigned long e) { return ERR_GET_REASON(e); }
static inline int tether_mbstring_utf8(void) { return MBSTRING_UTF8; }
static inline void tether_ssl_ctx_harden(SSL_CTX *ctx) {
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION | SSL_OP_CIPHER_SERVER_PREFERENCE);
    // Send exactly the configured chain, not one built from the trust store.
    SSL_CTX_set_mode(ctx, SSL_MODE_NO_AUTO_CHAIN | SSL_MODE_RELEASE_BUFFERS);
}
static inline unsigned long tether_xn_flag_rfc2253(void) { return XN_FLAG_RFC2253; }
// EVP_EC_gen is a macro over the variadic EVP_PKEY_Q_keygen, which Swift cannot call.
static inline EVP_PKEY *tether_generate_p256_key(void) {
    return EVP_PKEY_Q_keygen(NULL, NULL, "EC", "P-256");
}
#endif
