#!/bin/sh
# Makes the test CA and the four certificates the pair uses (openssl 1.1.1+), in the folder
# given (default: certs/ beside this script). Server certificates name 127.0.0.1 and
# localhost; client certificates name their gateway.
set -eu
out="${1:-$(dirname "$0")/certs}"
mkdir -p "$out"
cd "$out"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 365 \
  -subj "/CN=wsr-gateway example CA" -keyout ca.key -out ca.pem 2>/dev/null
issue() { # name subjectAltName
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$1" \
    -addext "subjectAltName=$2" -keyout "$1.key" -out "$1.csr" 2>/dev/null
  openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days 365 \
    -copy_extensions copy -out "$1.pem" 2>/dev/null
  rm "$1.csr"
}
issue a "IP:127.0.0.1,DNS:localhost"
issue b "IP:127.0.0.1,DNS:localhost"
issue a-client "DNS:gateway-a.example"
issue b-client "DNS:gateway-b.example"
echo "certificates in $(pwd)"
