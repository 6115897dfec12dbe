        if (vec_ok && e + 8 <= n) {
            *(float4*)(out + e) = make_float4(v[0], v[1], v[2], v[3]);
            *(float4*)(out + e + 4) = make_float4(v[4], v[5], v[6], v[7]);
        } else {
            for (int i = 0; i < 8 && e + i < n; i++) out[e + i] = v[i];
        }
