package ipvs

// RequireIPVS is requireIPVS for the external test package.
var RequireIPVS = requireIPVS
