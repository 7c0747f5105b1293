// The certificate and key nginx uses for a handshake (js_set $certflow_certificate,
// given to both ssl_certificate and ssl_certificate_key as data:): the contents of
// the hostname's own file that `certflow edge --kind files` writes, else of the
// file of a wildcard one label up (*.shop.example.com for a.shop.example.com, never
// for a.b.shop.example.com), else of the default certificate. Run once per
// handshake: nginx caches the variable for the connection, so the certificate and
// the key come from one read. Naming the file for both directives made nginx open
// it twice, and a renewal's rename in between paired the old certificate with the
// new key (the handshake failed: "key values mismatch").
var fs = require('fs');

var NAME = /^[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)+$/;

function contents(path) {
    try {
        return fs.readFileSync(path, 'utf8');
    } catch (e) {
        return null;
    }
}

function certificate(r) {
    var dir = r.variables.certflow_dir;
    var name = (r.variables.ssl_server_name || '').toLowerCase().replace(/\.$/, '');
    if (name.length <= 253 && NAME.test(name)) {
        var own = contents(dir + '/' + name + '.pem');
        if (own !== null) {
            return own;
        }
        var wildcard = contents(dir + '/*' + name.slice(name.indexOf('.')) + '.pem');
        if (wildcard !== null) {
            return wildcard;
        }
    }
    return contents(r.variables.certflow_default_certificate) || '';
}

export default {certificate};
