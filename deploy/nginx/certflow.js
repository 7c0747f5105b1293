// Which certificate file nginx loads for a handshake (js_set $certflow_certificate):
// the hostname's own file that `certflow edge --kind files` writes, else the file
// of a wildcard one label up (*.shop.example.com for a.shop.example.com, never for
// a.b.shop.example.com), else the default certificate. Run on every handshake;
// at most two access() calls on the edge's directory (a tmpfs) before nginx
// reads the file it names.
var fs = require('fs');

var NAME = /^[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)+$/;

function readable(path) {
    try {
        fs.accessSync(path, fs.constants.R_OK);
        return true;
    } catch (e) {
        return false;
    }
}

function certificate(r) {
    var dir = r.variables.certflow_dir;
    var name = (r.variables.ssl_server_name || '').toLowerCase().replace(/\.$/, '');
    if (name.length <= 253 && NAME.test(name)) {
        var own = dir + '/' + name + '.pem';
        if (readable(own)) {
            return own;
        }
        var wildcard = dir + '/*' + name.slice(name.indexOf('.')) + '.pem';
        if (readable(wildcard)) {
            return wildcard;
        }
    }
    return r.variables.certflow_default_certificate;
}

export default {certificate};
